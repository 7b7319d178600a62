package chartcheck

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

// ChartDir is the chart, relative to this package.
var ChartDir = filepath.Join("..", "skein")

// KubeVersion is the Kubernetes version charts are rendered for (Helm's packages otherwise
// assume their own default).
const KubeVersion = "v1.37.0"

// Render loads the chart and renders it with overrides over values.yaml, as `helm template`
// does (the values schema checked first). provider answers `lookup` (nil: lookups find nothing,
// as in `helm template`).
func Render(overrides map[string]any, provider engine.ClientProvider) (map[string]string, *chart.Chart, error) {
	ch, err := loader.Load(ChartDir)
	if err != nil {
		return nil, nil, err
	}
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	vals, err := chartutil.CoalesceValues(ch, overrides)
	if err != nil {
		return nil, nil, err
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "skein", Namespace: "ml", IsInstall: true}, caps)
	if err != nil {
		return nil, nil, err
	}
	var out map[string]string
	if provider != nil {
		out, err = engine.RenderWithClientProvider(ch, rv, provider)
	} else {
		out, err = engine.Render(ch, rv)
	}
	return out, ch, err
}

// Documents splits the rendered templates into their YAML documents (in file order, empty ones
// and NOTES.txt left out).
func Documents(rendered map[string]string) []string {
	var names []string
	for name := range rendered {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var docs []string
	for _, name := range names {
		for _, d := range strings.Split(rendered[name], "\n---") {
			if strings.TrimSpace(stripComments(d)) != "" {
				docs = append(docs, d)
			}
		}
	}
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// DecodeStrict decodes one manifest into its typed object with client-go's scheme, refusing
// unknown, duplicate and mistyped fields.
func DecodeStrict(doc string) (runtime.Object, error) {
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	obj, gvk, err := dec.Decode(bytes.TrimSpace([]byte(doc)), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %.80q: %w", strings.TrimSpace(doc), err)
	}
	_ = gvk
	return obj, nil
}
