package chartcheck

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/skein-ai/skein/internal/kubetest"
)

// apiServer is a dynamic client and a REST mapper over a real kube-apiserver, with the chart's
// release namespace made.
type apiServer struct {
	cs     k8sclient.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func startAPIServer(ctx context.Context, t *testing.T) apiServer {
	t.Helper()
	cp := kubetest.Start(t, kubetest.Options{})
	cs, err := k8sclient.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	return apiServer{cs: cs, dyn: dyn, mapper: mapper}
}

// create sends one manifest as `helm install` would (a create in the release namespace), with
// strict field validation; dryRun: the server admits and validates it but stores nothing.
func (a apiServer) create(ctx context.Context, doc string, dryRun bool) error {
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return err
	}
	var obj unstructured.Unstructured
	if err := obj.UnmarshalJSON(j); err != nil {
		return err
	}
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace("ml")
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Create(ctx, &obj, opts)
	return err
}

// Against a real kube-apiserver v1.37 (SKEIN_TEST_KUBE_APISERVER): every manifest the chart
// renders passes server-side dry-run with strict field validation (admission, defaulting and the
// API's own validation, beyond what a schema says); a manifest with an unknown field or a bad
// value is refused, so the check can fail; and the gateway's ServiceAccount, once its Role and
// RoleBinding are really applied, may watch endpointslices and nothing else the test asks.
func TestChartPassesServerSideDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := startAPIServer(ctx, t)
	out, _, err := Render(twoPools, nil)
	if err != nil {
		t.Fatal(err)
	}
	docs := Documents(out)
	if len(docs) < 10 {
		t.Fatalf("%d documents rendered", len(docs))
	}
	var deployment string
	for _, doc := range docs {
		if err := api.create(ctx, doc, true); err != nil {
			t.Errorf("dry-run refused %.120q: %v", strings.TrimSpace(doc), err)
		}
		if strings.Contains(doc, "kind: Deployment") && strings.Contains(doc, "skein-worker-qwen3-8b") {
			deployment = doc
		}
	}
	if _, err := api.cs.AppsV1().Deployments("ml").Get(ctx, "skein-gateway", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after a dry run the gateway Deployment is there (err %v)", err)
	}
	t.Run("refusals", func(t *testing.T) { testRefusals(ctx, t, api, deployment) })
	t.Run("gateway RBAC", func(t *testing.T) { testGatewayRBAC(ctx, t, api, docs) })
}

func testRefusals(ctx context.Context, t *testing.T, api apiServer, deployment string) {
	if deployment == "" {
		t.Fatal("no worker Deployment rendered")
	}
	cases := []struct{ name, from, to, want string }{
		{"unknown field", "imagePullPolicy: IfNotPresent", "imagePullPolcy: IfNotPresent", `unknown field "spec.template.spec.initContainers[0].imagePullPolcy"`},
		{"port out of range", "containerPort: 8001", "containerPort: 70000", "must be between 1 and 65535"},
		{"bad pull policy", "imagePullPolicy: IfNotPresent", "imagePullPolicy: Sometimes", "Unsupported value"},
	}
	for _, c := range cases {
		bad := strings.Replace(deployment, c.from, c.to, 1)
		if bad == deployment {
			t.Fatalf("%s: %q not in the rendered Deployment", c.name, c.from)
		}
		err := api.create(ctx, bad, true)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: dry-run answered %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// testGatewayRBAC applies the chart's ServiceAccount, Role and RoleBinding for real and asks the
// API server's authorizer what the gateway's identity may do.
func testGatewayRBAC(ctx context.Context, t *testing.T, api apiServer, docs []string) {
	applied := 0
	for _, doc := range docs {
		if strings.Contains(doc, "kind: ServiceAccount") || strings.Contains(doc, "kind: Role") {
			if err := api.create(ctx, doc, false); err != nil {
				t.Fatal(err)
			}
			applied++
		}
	}
	if applied != 3 {
		t.Fatalf("applied %d of ServiceAccount, Role, RoleBinding", applied)
	}
	user := "system:serviceaccount:ml:skein-gateway"
	for _, c := range []struct {
		group, resource, verb, ns string
		allowed                   bool
	}{
		{"discovery.k8s.io", "endpointslices", "watch", "ml", true},
		{"discovery.k8s.io", "endpointslices", "list", "ml", true},
		{"discovery.k8s.io", "endpointslices", "get", "ml", true},
		{"discovery.k8s.io", "endpointslices", "create", "ml", false},
		{"discovery.k8s.io", "endpointslices", "list", "kube-system", false},
		{"", "pods", "list", "ml", false},
		{"", "secrets", "get", "ml", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:ml", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: c.group, Resource: c.resource, Verb: c.verb, Namespace: c.ns}}}
		got, err := api.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != c.allowed {
			t.Errorf("%s %s.%s in %s: allowed %v, want %v (%s)", c.verb, c.resource, c.group, c.ns, got.Status.Allowed, c.allowed, got.Status.Reason)
		}
	}
}
