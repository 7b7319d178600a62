package kubernetes_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/discovery/discoverytest"
	"github.com/skein-ai/skein/discovery/kubernetes"
)

const ns = "skein"

var workerLabels = map[string]string{"app.kubernetes.io/component": "skein-worker", "kubernetes.io/service-name": "skein-workers-qwen"}

func ptr[T any](v T) *T { return &v }

// ep is one slice endpoint of a pod.
func ep(pod, ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Terminating: ptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}}
}

func slice(name string, lbls map[string]string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("worker"), Port: ptr(int32(8001))}, {Name: ptr("metrics"), Port: ptr(int32(9090))}},
		Endpoints:   eps,
	}
}

// waitFor waits until the recorder's membership is want (pod → ready).
func waitFor(t *testing.T, rec *discoverytest.Recorder, want map[string]bool, what string) {
	t.Helper()
	waitForWithin(t, rec, want, what, 10*time.Second)
}

func waitForWithin(t *testing.T, rec *discoverytest.Recorder, want map[string]bool, what string, limit time.Duration) {
	t.Helper()
	deadline := time.After(limit)
	for {
		ch := rec.Changed()
		got := map[string]bool{}
		for id, e := range rec.Members() {
			got[id] = e.Ready
		}
		if len(got) == len(want) {
			same := true
			for id, r := range want {
				if g, ok := got[id]; !ok || g != r {
					same = false
				}
			}
			if same {
				return
			}
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: members %v, want %v", what, got, want)
		}
	}
}

func TestEndpointSlicesBecomeOrderedMembership(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	src, err := kubernetes.New(cs, kubernetes.Config{Namespace: ns, Selector: "app.kubernetes.io/component=skein-worker", PortName: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	var rec discoverytest.Recorder
	done := make(chan error)
	go func() { done <- src.Start(ctx, &rec) }()
	sl := cs.DiscoveryV1().EndpointSlices(ns)

	// A slice of another Service: the fake clientset's watch does not apply the selector, the
	// source must.
	if _, err := sl.Create(ctx, slice("other-abc", map[string]string{"app": "other"}, ep("other-0", "10.9.0.1", true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := slice("skein-workers-qwen-abc", workerLabels, ep("w-0", "10.0.0.1", true, false), ep("w-1", "10.0.0.2", false, false))
	if _, err := sl.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &rec, map[string]bool{ns + "/w-0": true, ns + "/w-1": false}, "created")
	got := rec.Members()[ns+"/w-0"]
	if got.URL != "http://10.0.0.1:8001" {
		t.Fatalf("w-0 URL %q: the port named worker is 8001", got.URL)
	}

	// w-1 passes its readiness probe; w-0 starts terminating (SIGTERM: drained, not dropped).
	s.Endpoints = []discoveryv1.Endpoint{ep("w-0", "10.0.0.1", false, true), ep("w-1", "10.0.0.2", true, false)}
	if _, err := sl.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &rec, map[string]bool{ns + "/w-0": false, ns + "/w-1": true}, "w-0 terminating")

	// A second slice of the same Service (the controller splits big ones) adds w-2; w-0 leaves.
	s2 := slice("skein-workers-qwen-def", workerLabels, ep("w-2", "10.0.0.3", true, false))
	if _, err := sl.Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Endpoints = []discoveryv1.Endpoint{ep("w-1", "10.0.0.2", true, false)}
	if _, err := sl.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &rec, map[string]bool{ns + "/w-1": true, ns + "/w-2": true}, "w-0 gone, w-2 added")

	// Relabelled away from the selector: its endpoints go, as if deleted.
	s2.Labels = map[string]string{"app": "other"}
	if _, err := sl.Update(ctx, s2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &rec, map[string]bool{ns + "/w-1": true}, "slice relabelled")

	if err := sl.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &rec, map[string]bool{}, "slice deleted")

	// Every event, in order: the other Service's slice never appears.
	want := []string{"+skein/w-0", "+skein/w-1(draining)", "+skein/w-0(draining)", "+skein/w-1", "+skein/w-2", "-skein/w-0", "-skein/w-2", "-skein/w-1"}
	if got := rec.Events(); !slices.Equal(got, want) {
		// The first slice and its update may be seen as one state (the informer's list) on a slow
		// machine; the order within what was seen must still hold.
		if !isSubsequence(want, got) {
			t.Fatalf("events %v, want (a subsequence of) %v", got, want)
		}
	}
	for _, ev := range rec.Events() {
		if strings.Contains(ev, "other") {
			t.Fatalf("a slice outside the selector was reported: %s", ev)
		}
	}
	cancel()
	<-done
}

func isSubsequence(all, part []string) bool {
	i := 0
	for _, p := range part {
		for i < len(all) && all[i] != p {
			i++
		}
		if i == len(all) {
			return false
		}
		i++
	}
	return true
}

func TestSlicesThatCannotBeUsedAreSkippedWithAnError(t *testing.T) {
	cases := []struct {
		name  string
		slice *discoveryv1.EndpointSlice
		port  string
	}{
		{"no port of that name", slice("a", workerLabels, ep("w-0", "10.0.0.1", true, false)), "grpc"},
		{"several ports and none named", slice("b", workerLabels, ep("w-0", "10.0.0.1", true, false)), ""},
		{"fqdn addresses", func() *discoveryv1.EndpointSlice {
			s := slice("c", workerLabels, ep("w-0", "w0.example", true, false))
			s.AddressType = discoveryv1.AddressTypeFQDN
			return s
		}(), "worker"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cs := fake.NewClientset(c.slice)
			src, err := kubernetes.New(cs, kubernetes.Config{Namespace: ns, Selector: "app.kubernetes.io/component=skein-worker", PortName: c.port})
			if err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, 4)
			src.OnError = func(err error) { errs <- err }
			var rec discoverytest.Recorder
			go func() { _ = src.Start(ctx, &rec) }()
			select {
			case err := <-errs:
				if !strings.Contains(err.Error(), c.slice.Name) {
					t.Fatalf("error %v does not name the slice", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no error reported")
			}
			if m := rec.Members(); len(m) != 0 {
				t.Fatalf("members %v from an unusable slice", m)
			}
		})
	}
}

func TestNewChecksItsConfig(t *testing.T) {
	cs := fake.NewClientset()
	for _, cfg := range []kubernetes.Config{
		{Selector: "a=b"},                            // no namespace
		{Namespace: ns},                              // no selector
		{Namespace: ns, Selector: "a in (b"},         // bad selector
		{Namespace: ns, Selector: "a=b", Resync: -1}, // negative resync
	} {
		if _, err := kubernetes.New(cs, cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

var _ discovery.Discovery = (*kubernetes.Source)(nil)
