package chartcheck

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// twoPools renders two worker pools and every optional value set.
var twoPools = map[string]any{
	"postgres": map[string]any{"existingSecret": "skein-pg"},
	"storage":  map[string]any{"url": "s3://skein-ckpt/prod", "endpoint": "https://minio.ml:9000", "existingSecret": "skein-s3"},
	"workerPools": []any{
		map[string]any{"name": "qwen3-8b", "baseModel": "Qwen/Qwen3-8B", "modelURL": "s3://models/Qwen3-8B", "replicas": 2, "maxLoras": 16},
		map[string]any{"name": "llama-1b", "baseModel": "meta-llama/Llama-3.2-1B", "modelURL": "s3://models/Llama-3.2-1B", "replicas": 1, "maxLoras": 8},
	},
}

type objects struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	netpols     []*networkingv1.NetworkPolicy
	roles       []*rbacv1.Role
	secrets     []*corev1.Secret
	all         []runtime.Object
}

func render(t *testing.T, overrides map[string]any) objects {
	t.Helper()
	out, _, err := Render(overrides, nil)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}

func decodeAll(t *testing.T, out map[string]string) objects {
	t.Helper()
	o := objects{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{}}
	for _, doc := range Documents(out) {
		obj, err := DecodeStrict(doc)
		if err != nil {
			t.Fatal(err)
		}
		o.all = append(o.all, obj)
		switch x := obj.(type) {
		case *appsv1.Deployment:
			o.deployments[x.Name] = x
		case *corev1.Service:
			o.services[x.Name] = x
		case *policyv1.PodDisruptionBudget:
			o.pdbs = append(o.pdbs, x)
		case *networkingv1.NetworkPolicy:
			o.netpols = append(o.netpols, x)
		case *rbacv1.Role:
			o.roles = append(o.roles, x)
		case *corev1.Secret:
			o.secrets = append(o.secrets, x)
		}
	}
	return o
}

// Every rendered manifest decodes strictly into its typed object (no unknown, duplicate or
// mistyped field), and the chart has what it promises: one gateway Deployment and its
// PodDisruptionBudget, one worker Deployment, headless Service and PodDisruptionBudget per pool,
// one NetworkPolicy, one Role, the token.
func TestChartRendersStrictManifests(t *testing.T) {
	o := render(t, twoPools)
	want := []string{"skein-gateway", "skein-worker-llama-1b", "skein-worker-qwen3-8b"}
	var got []string
	for name := range o.deployments {
		got = append(got, name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("deployments %v, want %v", got, want)
	}
	for _, pool := range []string{"skein-worker-llama-1b", "skein-worker-qwen3-8b"} {
		svc := o.services[pool]
		if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Fatalf("pool %s: no headless Service (%+v)", pool, svc)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(o.deployments[pool].Spec.Template.Labels)) {
			t.Fatalf("pool %s: its Service does not select its pods", pool)
		}
	}
	if len(o.pdbs) != 3 || len(o.netpols) != 1 || len(o.roles) != 1 || len(o.secrets) != 1 {
		t.Fatalf("%d PDBs, %d NetworkPolicies, %d Roles, %d Secrets; want 3, 1, 1, 1", len(o.pdbs), len(o.netpols), len(o.roles), len(o.secrets))
	}
}

// Every pod runs non-root with a read-only root filesystem, no capabilities, no privilege
// escalation and the RuntimeDefault seccomp profile; init containers too.
func TestPodsAreLockedDown(t *testing.T) {
	o := render(t, twoPools)
	for name, d := range o.deployments {
		ps := d.Spec.Template.Spec
		if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: pod not runAsNonRoot", name)
		}
		for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
			sc := c.SecurityContext
			ok := sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem &&
				sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation &&
				sc.Capabilities != nil && slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) && len(sc.Capabilities.Add) == 0 &&
				sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
			if !ok {
				t.Errorf("%s/%s: security context %+v", name, c.Name, sc)
			}
		}
	}
}

// A pool that gives only the required fields (twoPools' pools) renders no empty flag and no
// null field: the worker gets --precision=bf16 and --step-memory-mb=4096 (an empty value would
// stop it at start), the model volume is an unbounded emptyDir, and the PodDisruptionBudget lets
// one worker down at a time. (kubeconform found the nulls: the API server and a strict decode
// take null as absent.)
func TestPoolsDefaultTheirOptionalFields(t *testing.T) {
	out, _, err := Render(twoPools, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range Documents(out) {
		var tree any
		if err := yaml.Unmarshal([]byte(doc), &tree); err != nil {
			t.Fatal(err)
		}
		for _, where := range nullsAndEmptyFlags(tree, "") {
			t.Errorf("%.60q: %s", strings.TrimSpace(doc), where)
		}
	}
	o := decodeAll(t, out)
	w := o.deployments["skein-worker-llama-1b"].Spec.Template.Spec
	if v, _ := arg(w.Containers[0], "--precision"); v != "bf16" {
		t.Errorf("--precision=%q", v)
	}
	if v, _ := arg(w.Containers[0], "--step-memory-mb"); v != "4096" {
		t.Errorf("--step-memory-mb=%q", v)
	}
	if v, _ := arg(w.Containers[0], "--kv-cache-mb"); v != "1024" {
		t.Errorf("--kv-cache-mb=%q", v)
	}
	if w.Volumes[0].Name != "model" || w.Volumes[0].EmptyDir == nil || w.Volumes[0].EmptyDir.SizeLimit != nil {
		t.Errorf("model volume %+v", w.Volumes[0])
	}
	for _, pdb := range o.pdbs {
		if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("%s: minAvailable %v maxUnavailable %v, want maxUnavailable 1", pdb.Name, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
		}
	}
	// The defaults' own pool keeps what values.yaml says.
	d := render(t, map[string]any{"postgres": map[string]any{"existingSecret": "pg"}, "sharedData": map[string]any{"existingClaim": "c"}})
	if pdb := pdbOf(t, d, "skein-worker-qwen3-8b"); pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("values.yaml's pool: PDB %+v", pdb.Spec)
	}
}

// nullsAndEmptyFlags lists the places in a decoded manifest that hold null, or a "--flag=" string
// with nothing after the "=".
func nullsAndEmptyFlags(v any, at string) []string {
	switch x := v.(type) {
	case nil:
		return []string{at + " is null"}
	case string:
		if strings.HasPrefix(x, "--") && strings.HasSuffix(x, "=") {
			return []string{at + " is the empty flag " + x}
		}
	case map[string]any:
		var out []string
		for k, e := range x {
			out = append(out, nullsAndEmptyFlags(e, at+"."+k)...)
		}
		return out
	case []any:
		var out []string
		for i, e := range x {
			out = append(out, nullsAndEmptyFlags(e, fmt.Sprintf("%s[%d]", at, i))...)
		}
		return out
	}
	return nil
}

func arg(c corev1.Container, flag string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The gateway discovers exactly the workers: its EndpointSlice selector matches the labels of
// every pool's headless Service (which the EndpointSlice controller copies onto the slices) and
// nothing else the chart makes, on the named port the worker's probes and Service use. Its Role
// grants get/list/watch on endpointslices and nothing more.
func TestGatewayDiscoversThePoolsWithALeastPrivilegeRole(t *testing.T) {
	o := render(t, twoPools)
	gw := o.deployments["skein-gateway"].Spec.Template.Spec.Containers[0]
	if v, _ := arg(gw, "--discover"); v != "kubernetes" {
		t.Fatalf("gateway --discover=%q", v)
	}
	selStr, _ := arg(gw, "--discover-selector")
	sel, err := labels.Parse(selStr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := arg(gw, "--discover-port-name")
	for name, svc := range o.services {
		isWorker := strings.HasPrefix(name, "skein-worker-")
		if sel.Matches(labels.Set(svc.Labels)) != isWorker {
			t.Errorf("selector %q matches Service %s: %v, want %v", selStr, name, !isWorker, isWorker)
		}
		if isWorker && (len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != port) {
			t.Errorf("Service %s ports %+v, gateway watches port %q", name, svc.Spec.Ports, port)
		}
	}
	for name, d := range o.deployments {
		if !strings.HasPrefix(name, "skein-worker-") {
			continue
		}
		w := d.Spec.Template.Spec.Containers[0]
		if w.ReadinessProbe == nil || w.ReadinessProbe.HTTPGet.Path != "/readyz" || w.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("%s: probes %+v %+v", name, w.ReadinessProbe, w.LivenessProbe)
		}
		if v, ok := arg(w, "--gateway"); ok {
			t.Errorf("%s registers with %s: discovered workers must not", name, v)
		}
		if len(d.Spec.Template.Spec.InitContainers) != 1 || !slices.Contains(d.Spec.Template.Spec.InitContainers[0].Args, "/models/base") {
			t.Errorf("%s: no init container copying the model to /models/base", name)
		}
	}
	rules := o.roles[0].Rules
	if len(rules) != 1 || !slices.Equal(rules[0].APIGroups, []string{"discovery.k8s.io"}) ||
		!slices.Equal(rules[0].Resources, []string{"endpointslices"}) || !slices.Equal(rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Fatalf("role rules %+v", rules)
	}
}

// The NetworkPolicy admits traffic to the workers from the gateway's pods only.
func TestWorkersAdmitOnlyTheGateway(t *testing.T) {
	o := render(t, twoPools)
	np := o.netpols[0]
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range o.deployments {
		applies := sel.Matches(labels.Set(d.Spec.Template.Labels))
		if applies != strings.HasPrefix(name, "skein-worker-") {
			t.Errorf("policy applies to %s: %v", name, applies)
		}
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 {
		t.Fatalf("ingress %+v", np.Spec.Ingress)
	}
	from := np.Spec.Ingress[0].From[0]
	if from.NamespaceSelector != nil || from.IPBlock != nil || from.PodSelector == nil {
		t.Fatalf("from %+v: only pods of this namespace", from)
	}
	fromSel, _ := metav1.LabelSelectorAsSelector(from.PodSelector)
	for name, d := range o.deployments {
		if fromSel.Matches(labels.Set(d.Spec.Template.Labels)) != (name == "skein-gateway") {
			t.Errorf("ingress admits %s: %v", name, name != "skein-gateway")
		}
	}
}

// Credentials come from existing Secrets only: the PostgreSQL URL and the S3 keys are
// secretKeyRefs, never values in the manifests.
func TestCredentialsComeFromExistingSecrets(t *testing.T) {
	o := render(t, twoPools)
	refs := map[string]string{}
	for _, d := range o.deployments {
		for _, c := range append(slices.Clone(d.Spec.Template.Spec.InitContainers), d.Spec.Template.Spec.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					refs[e.Name] = e.ValueFrom.SecretKeyRef.Name
				} else if strings.Contains(e.Name, "SECRET") || e.Name == "SKEIN_STATE" || e.Name == "SKEIN_WORKER_TOKEN" {
					t.Errorf("%s/%s: %s set by value", d.Name, c.Name, e.Name)
				}
			}
		}
	}
	want := map[string]string{"SKEIN_STATE": "skein-pg", "AWS_ACCESS_KEY_ID": "skein-s3", "AWS_SECRET_ACCESS_KEY": "skein-s3", "SKEIN_WORKER_TOKEN": "skein-worker-token"}
	for k, v := range want {
		if refs[k] != v {
			t.Errorf("%s from Secret %q, want %q", k, refs[k], v)
		}
	}
}

// secretProvider answers the chart's lookup of its token Secret from a fake cluster.
type secretProvider struct{ client dynamic.Interface }

func (p secretProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	return p.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
}

// The worker token is generated on install and kept on upgrade: with the Secret already in the
// cluster, the render carries the same token (helm lookup), not a new random one.
func TestWorkerTokenSurvivesUpgrades(t *testing.T) {
	first := render(t, twoPools).secrets[0]
	token := first.Data["token"]
	if len(token) < 32 {
		t.Fatalf("generated token %q is short", token)
	}
	if again := render(t, twoPools).secrets[0].Data["token"]; string(again) == string(token) {
		t.Fatal("two installs generated one token: it is not random")
	}
	existing := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "skein-worker-token", "namespace": "ml"},
		"data":     map[string]any{"token": base64.StdEncoding.EncodeToString(token)},
	}}
	fc := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), existing)
	out, _, err := Render(twoPools, secretProvider{fc})
	if err != nil {
		t.Fatal(err)
	}
	upgraded := decodeAll(t, out).secrets[0]
	if string(upgraded.Data["token"]) != string(token) {
		t.Fatalf("upgrade rendered token %q, the cluster holds %q", upgraded.Data["token"], token)
	}
	if upgraded.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Fatal("the token Secret is not kept when the release is deleted")
	}
	// With an existing Secret named, the chart makes none.
	o := render(t, map[string]any{"workerToken": map[string]any{"existingSecret": "mine"}, "storage": map[string]any{"url": "s3://bkt/p"}, "gateway": oneGateway})
	if len(o.secrets) != 0 {
		t.Fatalf("%d token Secrets rendered with workerToken.existingSecret set", len(o.secrets))
	}
}

// The schema refuses what the chart cannot do: no gateway or absurdly many, open auth, unknown
// keys, bad pool names, a root pod. (Two gateways are allowed since issue 38's run leases; see
// TestSeveralGatewaysNeedPostgres.)
func TestSchemaRefusesBadValues(t *testing.T) {
	cases := []struct {
		name      string
		overrides map[string]any
		mention   string
	}{
		{"no gateway", map[string]any{"gateway": map[string]any{"replicas": 0}}, "replicas"},
		{"65 gateways", map[string]any{"gateway": map[string]any{"replicas": 65}}, "replicas"},
		{"gateways as a string", map[string]any{"gateway": map[string]any{"replicas": "2"}}, "replicas"},
		{"open auth", map[string]any{"gateway": map[string]any{"auth": "open"}}, "auth"},
		{"unknown key", map[string]any{"gatway": map[string]any{}}, "gatway"},
		{"bad pool name", map[string]any{"workerPools": []any{map[string]any{"name": "Qwen_8B", "baseModel": "q", "modelURL": "s3://m/q", "replicas": 1, "maxLoras": 1}}}, "name"},
		{"no pools", map[string]any{"workerPools": []any{}}, "workerPools"},
		{"root", map[string]any{"podSecurityContext": map[string]any{"runAsNonRoot": false}}, "runAsNonRoot"},
		{"storage not s3", map[string]any{"storage": map[string]any{"url": "file:///data"}}, "url"},
	}
	for _, c := range cases {
		_, _, err := Render(c.overrides, nil)
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: err %v, want a schema error mentioning %q", c.name, err, c.mention)
		}
	}
}

// helm lint --strict: no errors and no warnings, for Kubernetes 1.37.
func TestLintStrict(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	shared := map[string]any{"sharedData": map[string]any{"existingClaim": "skein-data"}}
	for _, vals := range []map[string]any{shared, twoPools} {
		l := lint.AllWithKubeVersion(ChartDir, vals, "ml", kv)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("lint: %s", m)
			}
		}
	}
}

// The gateway and its workers share their data: object storage, or one ReadWriteMany claim
// mounted at /data in every pod; with neither the chart refuses to render, saying why.
func TestDataIsSharedOrTheChartRefuses(t *testing.T) {
	if _, _, err := Render(nil, nil); err == nil || !strings.Contains(err.Error(), "sharedData.existingClaim") {
		t.Fatalf("neither storage nor a shared claim: %v", err)
	}
	o := render(t, map[string]any{"sharedData": map[string]any{"existingClaim": "skein-data"}, "gateway": oneGateway})
	for name, d := range o.deployments {
		var claim string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "data" && v.PersistentVolumeClaim != nil {
				claim = v.PersistentVolumeClaim.ClaimName
			}
		}
		mounted := false
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			mounted = mounted || (m.Name == "data" && m.MountPath == "/data" && !m.ReadOnly)
		}
		if claim != "skein-data" || !mounted {
			t.Errorf("%s: data volume claim %q, mounted at /data %v", name, claim, mounted)
		}
	}
	// With object storage the pods' /data is their own scratch space.
	for name, d := range render(t, twoPools).deployments {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "data" && v.EmptyDir == nil {
				t.Errorf("%s: data volume %+v with storage.url set", name, v)
			}
		}
	}
}

// oneGateway is the gateway values of a release without PostgreSQL (SQLite in /data).
var oneGateway = map[string]any{"replicas": 1}

// pdbOf finds a PodDisruptionBudget by name.
func pdbOf(t *testing.T, o objects, name string) *policyv1.PodDisruptionBudget {
	t.Helper()
	for _, p := range o.pdbs {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no PodDisruptionBudget %s", name)
	return nil
}

// Gateways default to two (issue 38): they share PostgreSQL, roll one at a time (a new one
// beside the old), prefer distinct nodes, keep all but one up through drains, and tell each
// other where they serve (pod IP) for forwarding. Without PostgreSQL the chart refuses more than
// one, saying why; one gateway on SQLite is replaced with Recreate, never two over one file.
func TestSeveralGatewaysNeedPostgres(t *testing.T) {
	noPG := map[string]any{"storage": map[string]any{"url": "s3://bkt/p"}}
	if _, _, err := Render(noPG, nil); err == nil || !strings.Contains(err.Error(), "postgres.existingSecret") {
		t.Fatalf("two gateways without PostgreSQL: %v, want a refusal naming postgres.existingSecret", err)
	}
	o := render(t, twoPools)
	gw := o.deployments["skein-gateway"]
	if gw.Spec.Replicas == nil || *gw.Spec.Replicas != 2 {
		t.Fatalf("gateway replicas %v, want the default 2", gw.Spec.Replicas)
	}
	if st := gw.Spec.Strategy; st.Type != appsv1.RollingUpdateDeploymentStrategyType || st.RollingUpdate == nil ||
		st.RollingUpdate.MaxUnavailable.IntValue() != 0 || st.RollingUpdate.MaxSurge.IntValue() != 1 {
		t.Fatalf("strategy %+v, want a rolling update of one new gateway beside the old ones", st)
	}
	pdb := pdbOf(t, o, "skein-gateway")
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 ||
		!labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(gw.Spec.Template.Labels)) {
		t.Fatalf("gateway PDB %+v", pdb.Spec)
	}
	for _, d := range o.deployments {
		if d.Name != "skein-gateway" && labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Fatalf("the gateway PDB also selects %s", d.Name)
		}
	}
	aff := gw.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity %+v, want a preferred pod anti-affinity", aff)
	}
	term := aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	if term.TopologyKey != "kubernetes.io/hostname" || !labels.SelectorFromSet(term.LabelSelector.MatchLabels).Matches(labels.Set(gw.Spec.Template.Labels)) {
		t.Fatalf("anti-affinity term %+v", term)
	}
	c := gw.Spec.Template.Spec.Containers[0]
	if v, _ := arg(c, "--advertise-url"); v != "http://$(POD_IP):8000" {
		t.Fatalf("--advertise-url=%q", v)
	}
	podIP := false
	for _, e := range c.Env {
		podIP = podIP || (e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP")
	}
	if !podIP {
		t.Fatal("no POD_IP from the downward API for --advertise-url")
	}
	// Three gateways are allowed; one without PostgreSQL is replaced, never doubled.
	three := map[string]any{"gateway": map[string]any{"replicas": 3}}
	for k, v := range twoPools {
		three[k] = v
	}
	if g := render(t, three).deployments["skein-gateway"]; *g.Spec.Replicas != 3 {
		t.Fatalf("replicas %d", *g.Spec.Replicas)
	}
	noPG["gateway"] = oneGateway
	if g := render(t, noPG).deployments["skein-gateway"]; *g.Spec.Replicas != 1 || g.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Fatalf("one gateway on SQLite: %d replicas, strategy %s", *g.Spec.Replicas, g.Spec.Strategy.Type)
	}
}

// A pool's kvCacheMB reaches its workers as given: 0 (off) is not taken for absent, and the
// largest allowed is written as an integer, not in a float's exponent form; past it the schema
// refuses the values.
func TestPoolKVCacheMB(t *testing.T) {
	for _, c := range []struct {
		mb   any
		want string
	}{{0, "0"}, {1048576, "1048576"}} {
		pool := map[string]any{"name": "p", "baseModel": "b", "modelURL": "s3://m/b", "replicas": 1, "maxLoras": 2, "kvCacheMB": c.mb}
		o := render(t, map[string]any{"storage": twoPools["storage"], "workerPools": []any{pool}, "gateway": oneGateway})
		if v, _ := arg(o.deployments["skein-worker-p"].Spec.Template.Spec.Containers[0], "--kv-cache-mb"); v != c.want {
			t.Errorf("kvCacheMB %v: --kv-cache-mb=%q, want %q", c.mb, v, c.want)
		}
	}
	pool := map[string]any{"name": "p", "baseModel": "b", "modelURL": "s3://m/b", "replicas": 1, "maxLoras": 2, "kvCacheMB": 1048577}
	if _, _, err := Render(map[string]any{"storage": twoPools["storage"], "workerPools": []any{pool}, "gateway": oneGateway}, nil); err == nil || !strings.Contains(err.Error(), "kvCacheMB") {
		t.Errorf("a kvCacheMB past 1 TiB: %v, want the schema's refusal", err)
	}
}
