package kubernetes_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/skein-ai/skein/discovery/discoverytest"
	"github.com/skein-ai/skein/discovery/kubernetes"
	"github.com/skein-ai/skein/internal/kubetest"
)

const realNS = "ml"

// chartLabels are the labels the chart puts on a pool's headless Service (release "skein"), which
// the EndpointSlice controller copies onto its slices; chartSelector is the gateway's
// --discover-selector. deploy/helm/chartcheck checks the chart renders exactly these.
func chartLabels(pool string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name": "skein", "app.kubernetes.io/instance": "skein", "app.kubernetes.io/version": "0.1.0",
		"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "skein-0.1.0",
		"app.kubernetes.io/component": "worker", "skein.ai/pool": pool,
	}
}

const chartSelector = "app.kubernetes.io/instance=skein,app.kubernetes.io/component=worker"

// Against a real kube-apiserver and the real EndpointSlice controller (SKEIN_TEST_KUBE_APISERVER),
// with the gateway's least-privilege token: pods of the workers' headless Services become ordered
// membership — ready endpoints join, not-ready and terminating ones are drained, deleted ones are
// dropped — and a Service outside the selector is never reported. The test is the scheduler (a
// Binding to a Node) and the kubelet (pod IP and Ready condition); the controller writes the slices.
func TestRealControlPlaneSlicesBecomeMembership(t *testing.T) {
	cp := kubetest.Start(t, kubetest.Options{Controllers: []string{"endpointslice-controller"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := k8sclient.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	setUpNamespace(ctx, t, admin)
	gw, err := k8sclient.NewForConfig(cp.ConfigForToken(gatewayToken(ctx, t, admin)))
	if err != nil {
		t.Fatal(err)
	}
	// The token really is the Role's: it may not read pods.
	if _, err := gw.CoreV1().Pods(realNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the gateway's token listed pods (err %v): it is not least privilege", err)
	}
	for _, svc := range []*corev1.Service{headless("skein-worker-qwen3-8b", chartLabels("qwen3-8b")), headless("skein-worker-llama-1b", chartLabels("llama-1b")),
		headless("skein-gateway", map[string]string{"app.kubernetes.io/instance": "skein", "app.kubernetes.io/component": "gateway"})} {
		if _, err := admin.CoreV1().Services(realNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	src, err := kubernetes.New(gw, kubernetes.Config{Namespace: realNS, Selector: chartSelector, PortName: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	src.OnError = func(err error) { t.Errorf("discovery: %v", err) }
	var rec discoverytest.Recorder
	done := make(chan error, 1)
	srcCtx, stopSrc := context.WithCancel(ctx)
	go func() { done <- src.Start(srcCtx, &rec) }()

	k := kubelet{t: t, ctx: ctx, cs: admin}
	k.runPod("w-0", "qwen3-8b", "10.244.0.10", true)
	k.runPod("w-1", "qwen3-8b", "10.244.0.11", false)
	k.runPod("gw-0", "gateway", "10.244.0.20", true) // the gateway's own Service: outside the selector
	waitForWithin(t, &rec, map[string]bool{"ml/w-0": true, "ml/w-1": false}, "w-0 ready, w-1 not ready", time.Minute)
	if u := rec.Members()["ml/w-0"].URL; u != "http://10.244.0.10:8001" {
		t.Fatalf("w-0 URL %q: the slice's port named worker is the container's 8001", u)
	}

	// w-1 passes its readiness probe; w-0 is deleted with a grace period (no kubelet ends it, so
	// it stays terminating): drained, not dropped.
	k.setReady("w-1", true)
	if err := admin.CoreV1().Pods(realNS).Delete(ctx, "w-0", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(300))}); err != nil {
		t.Fatal(err)
	}
	waitForWithin(t, &rec, map[string]bool{"ml/w-0": false, "ml/w-1": true}, "w-0 terminating", time.Minute)

	// w-0 is gone (what the kubelet does when it has stopped); a worker of the second pool joins.
	if err := admin.CoreV1().Pods(realNS).Delete(ctx, "w-0", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	k.runPod("l-0", "llama-1b", "10.244.0.30", true)
	waitForWithin(t, &rec, map[string]bool{"ml/w-1": true, "ml/l-0": true}, "w-0 gone, l-0 added", time.Minute)

	// w-1 fails its readiness probe: drained again.
	k.setReady("w-1", false)
	waitForWithin(t, &rec, map[string]bool{"ml/w-1": false, "ml/l-0": true}, "w-1 not ready", time.Minute)

	// Each pod's own events, in order, exactly: the waits above saw every state. (Across pods the
	// order may differ: one slice update can carry two pods' changes.)
	events := rec.Events()
	want := map[string][]string{
		"ml/w-0": {"+ml/w-0", "+ml/w-0(draining)", "-ml/w-0"},
		"ml/w-1": {"+ml/w-1(draining)", "+ml/w-1", "+ml/w-1(draining)"},
		"ml/l-0": {"+ml/l-0"},
	}
	for pod, w := range want {
		if got := eventsOf(events, pod); !slices.Equal(got, w) {
			t.Errorf("%s: events %v, want %v (all: %v)", pod, got, w, events)
		}
	}
	for _, ev := range events {
		if strings.Contains(ev, "gw-0") {
			t.Fatalf("a pod of a Service outside the selector was reported: %v", events)
		}
	}
	stopSrc()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Start returned %v", err)
	}
	if err := cp.Exited(); err != nil {
		t.Fatal(err)
	}
}

// eventsOf picks one endpoint's events ("+id", "+id(draining)", "-id").
func eventsOf(events []string, id string) []string {
	var out []string
	for _, ev := range events {
		if strings.TrimSuffix(ev[1:], "(draining)") == id {
			out = append(out, ev)
		}
	}
	return out
}

// setUpNamespace makes the namespace, its default ServiceAccount (the admission plugin wants
// one; no controller makes it here) and the Node pods are bound to (the EndpointSlice
// controller skips pods whose node it does not know).
func setUpNamespace(ctx context.Context, t *testing.T, admin k8sclient.Interface) {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: realNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(realNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// gatewayToken makes the gateway's ServiceAccount with the Role and RoleBinding the chart grants
// (get/list/watch on endpointslices in its namespace) and returns a token for it from the
// TokenRequest API.
func gatewayToken(ctx context.Context, t *testing.T, admin k8sclient.Interface) string {
	t.Helper()
	name := "skein-gateway"
	if _, err := admin.CoreV1().ServiceAccounts(realNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := admin.RbacV1().Roles(realNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: realNS}}}
	if _, err := admin.RbacV1().RoleBindings(realNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(realNS).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func headless(name string, lbls map[string]string) *corev1.Service {
	sel := map[string]string{"app.kubernetes.io/instance": "skein", "app.kubernetes.io/component": lbls["app.kubernetes.io/component"]}
	if pool, ok := lbls["skein.ai/pool"]; ok {
		sel["skein.ai/pool"] = pool
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: sel,
			Ports: []corev1.ServicePort{{Name: "worker", Port: 8001, TargetPort: intstr.FromString("worker"), Protocol: corev1.ProtocolTCP}}},
	}
}

// kubelet plays the scheduler and the kubelet for pods on node-a.
type kubelet struct {
	t   *testing.T
	ctx context.Context
	cs  k8sclient.Interface
}

// runPod creates a pod of a component ("gateway") or pool, binds it to node-a and reports it
// running at ip, ready or not.
func (k kubelet) runPod(name, poolOrComponent, ip string, ready bool) {
	k.t.Helper()
	lbls := map[string]string{"app.kubernetes.io/name": "skein", "app.kubernetes.io/instance": "skein", "app.kubernetes.io/component": "worker", "skein.ai/pool": poolOrComponent}
	if poolOrComponent == "gateway" {
		lbls = map[string]string{"app.kubernetes.io/instance": "skein", "app.kubernetes.io/component": "gateway"}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "ghcr.io/skein-ai/skein:test",
			Ports: []corev1.ContainerPort{{Name: "worker", ContainerPort: 8001, Protocol: corev1.ProtocolTCP}}}}},
	}
	pods := k.cs.CoreV1().Pods(realNS)
	if _, err := pods.Create(k.ctx, pod, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-a"}}
	if err := pods.Bind(k.ctx, b, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
	k.writeStatus(name, ip, ready)
}

func (k kubelet) setReady(name string, ready bool) {
	k.t.Helper()
	p, err := k.cs.CoreV1().Pods(realNS).Get(k.ctx, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	k.writeStatus(name, p.Status.PodIP, ready)
}

func (k kubelet) writeStatus(name, ip string, ready bool) {
	k.t.Helper()
	pods := k.cs.CoreV1().Pods(realNS)
	p, err := pods.Get(k.ctx, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP, p.Status.HostIPs = "192.168.0.1", []corev1.HostIP{{IP: "192.168.0.1"}}
	p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: cond, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: cond, LastTransitionTime: now},
	}
	if _, err := pods.UpdateStatus(k.ctx, p, metav1.UpdateOptions{}); err != nil {
		k.t.Fatal(fmt.Errorf("pod %s status: %w", name, err))
	}
}
