// Package kubernetes is a discovery source that watches the EndpointSlices of the workers'
// headless Services (--discover kubernetes) with a client-go informer. A ready endpoint is a
// worker that may take work; a not-ready or terminating one is drained (no new adapters go to
// it); an endpoint that leaves every slice, or whose slice is deleted, is dropped.
//
// Kubernetes gives membership only: the gateway's one-second check of each worker stays the fast
// failure path (a node that dies leaves its pods Ready in the API for tens of seconds).
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skein-ai/skein/discovery"
)

// Config says which EndpointSlices are the workers'.
type Config struct {
	// Namespace of the workers' Services ("" : the namespace this pod runs in, from the service
	// account; required outside a cluster).
	Namespace string
	// Selector is a label selector over EndpointSlices (they carry their Service's labels, and
	// kubernetes.io/service-name), e.g. "app.kubernetes.io/component=skein-worker".
	Selector string
	// PortName picks the slice port the workers listen on; "" takes the slice's only port.
	PortName string
	// Resync re-delivers every slice this often (0: never; the watch is the source of changes).
	Resync time.Duration
}

// Source watches EndpointSlices through a clientset.
type Source struct {
	client k8sclient.Interface
	ns     string
	sel    labels.Selector
	cfg    Config

	mu     sync.Mutex
	slices map[string][]discovery.Endpoint // by slice namespace/name: the endpoints it lists
	set    discovery.Set
	// OnError is told of slices that could not be used (no matching port, too many endpoints).
	OnError func(error)
}

var _ discovery.Discovery = (*Source)(nil)

// New makes a source over client (a real clientset, or client-go's fake in tests).
func New(client k8sclient.Interface, cfg Config) (*Source, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes discovery: no namespace (--discover-namespace, or run in a pod with a service account)")
	}
	if cfg.Selector == "" {
		return nil, errors.New("kubernetes discovery: no label selector for the workers' EndpointSlices (--discover-selector)")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: selector %q: %w", cfg.Selector, err)
	}
	if cfg.Resync < 0 {
		return nil, errors.New("kubernetes discovery: negative resync")
	}
	return &Source{client: client, ns: cfg.Namespace, sel: sel, cfg: cfg, slices: map[string][]discovery.Endpoint{}}, nil
}

// Clientset builds a clientset: from kubeconfig if given, else the pod's in-cluster service
// account. With no namespace configured, the in-cluster one is filled into cfg.
func Clientset(kubeconfig string, cfg *Config) (k8sclient.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
		if err == nil && cfg.Namespace == "" {
			cfg.Namespace = inClusterNamespace()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: %w", err)
	}
	rc.UserAgent = "skein-gateway"
	return k8sclient.NewForConfig(rc)
}

// Start runs the informer until ctx ends.
func (s *Source) Start(ctx context.Context, n discovery.Notifier) error {
	f := informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.Resync, informers.WithNamespace(s.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.sel.String() }))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	// Handlers run one at a time, in the order of the watch: upserts and deletes follow it.
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.sliceChanged(obj, n) },
		UpdateFunc: func(_, obj any) { s.sliceChanged(obj, n) },
		DeleteFunc: func(obj any) { s.sliceDeleted(obj, n) },
	})
	if err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
	return ctx.Err()
}

func (s *Source) sliceChanged(obj any, n discovery.Notifier) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	key := es.Namespace + "/" + es.Name
	s.mu.Lock()
	defer s.mu.Unlock()
	// The fake clientset does not apply label selectors to watches, and a slice's labels can
	// change so that it no longer matches: the selector is applied here as well.
	if !s.sel.Matches(labels.Set(es.Labels)) {
		delete(s.slices, key)
	} else {
		eps, err := s.endpointsOf(es)
		if err != nil {
			s.report(err)
			delete(s.slices, key)
		} else {
			s.slices[key] = eps
		}
	}
	s.publishLocked(n)
}

func (s *Source) sliceDeleted(obj any, n discovery.Notifier) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.slices, es.Namespace+"/"+es.Name)
	s.publishLocked(n)
}

// publishLocked merges every slice's endpoints (one pod may sit in two slices while they are
// rebalanced: it is ready if either says so) and notifies the difference.
func (s *Source) publishLocked(n discovery.Notifier) {
	merged := map[string]discovery.Endpoint{}
	for _, eps := range s.slices {
		for _, ep := range eps {
			if old, ok := merged[ep.ID]; ok && old.Ready {
				continue
			}
			merged[ep.ID] = ep
		}
	}
	all := make([]discovery.Endpoint, 0, len(merged))
	for _, ep := range merged {
		all = append(all, ep)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	if err := s.set.Apply(all, n); err != nil {
		s.report(err)
	}
}

func (s *Source) report(err error) {
	if s.OnError != nil {
		s.OnError(err)
	}
}

// endpointsOf lists a slice's endpoints: one per address, identified by its pod (TargetRef) or,
// without one, by its address and port. Ready is the slice's ready condition (absent means
// ready, as the API documents) and not terminating.
func (s *Source) endpointsOf(es *discoveryv1.EndpointSlice) ([]discovery.Endpoint, error) {
	if es.AddressType == discoveryv1.AddressTypeFQDN {
		return nil, fmt.Errorf("kubernetes discovery: slice %s/%s has FQDN addresses; only IP slices are used", es.Namespace, es.Name)
	}
	if len(es.Endpoints) == 0 {
		// The controller's placeholder for a Service with no pods yet has no ports: empty, not wrong.
		return nil, nil
	}
	port, err := s.portOf(es)
	if err != nil {
		return nil, err
	}
	if len(es.Endpoints) > discovery.MaxEndpoints {
		return nil, fmt.Errorf("kubernetes discovery: slice %s/%s: %w", es.Namespace, es.Name, discovery.ErrTooMany)
	}
	var out []discovery.Endpoint
	for _, e := range es.Endpoints {
		ready := (e.Conditions.Ready == nil || *e.Conditions.Ready) &&
			(e.Conditions.Terminating == nil || !*e.Conditions.Terminating)
		for i, addr := range e.Addresses {
			u := discovery.HostPortURL(addr, port)
			id := u[len("http://"):]
			if e.TargetRef != nil && e.TargetRef.Name != "" && i == 0 {
				id = e.TargetRef.Namespace + "/" + e.TargetRef.Name
			}
			out = append(out, discovery.Endpoint{ID: id, URL: u, Ready: ready})
			break // a pod's first address: a dual-stack pod is one worker, not two
		}
	}
	return out, nil
}

func (s *Source) portOf(es *discoveryv1.EndpointSlice) (int, error) {
	var found []int
	for _, p := range es.Ports {
		if p.Port == nil {
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if s.cfg.PortName == "" || name == s.cfg.PortName {
			found = append(found, int(*p.Port))
		}
	}
	switch {
	case len(found) == 1 && found[0] >= 1 && found[0] <= 65535:
		return found[0], nil
	case len(found) == 0:
		return 0, fmt.Errorf("kubernetes discovery: slice %s/%s has no port %q", es.Namespace, es.Name, s.cfg.PortName)
	default:
		return 0, fmt.Errorf("kubernetes discovery: slice %s/%s has several ports; name one (--discover-port-name)", es.Namespace, es.Name)
	}
}
