package kubernetes

import (
	"os"
	"strings"
)

// inClusterNamespace is the pod's namespace, as its service account token's mount says.
func inClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
