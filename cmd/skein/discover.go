package main

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/skein-ai/skein/discovery"
	"github.com/skein-ai/skein/discovery/dns"
	"github.com/skein-ai/skein/discovery/kubernetes"
	"github.com/skein-ai/skein/discovery/static"
)

// discoverFlags choose how the gateway finds its workers (package discovery).
type discoverFlags struct {
	Mode, Workers, DNS   string
	Interval             time.Duration
	Namespace, Selector  string
	PortName, Kubeconfig string
}

func (d *discoverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.Mode, "discover", "register", "how workers are found: register (they register and heartbeat), static (--discover-workers), dns (--discover-dns) or kubernetes (EndpointSlices, --discover-selector); registration is accepted in every mode")
	fs.StringVar(&d.Workers, "discover-workers", "", "static discovery: comma-separated worker addresses host:port")
	fs.StringVar(&d.DNS, "discover-dns", "", "dns discovery: a headless Service's NAME:PORT; every address it resolves to is a worker")
	fs.DurationVar(&d.Interval, "discover-interval", 2*time.Second, "dns discovery: how often the name is resolved")
	fs.StringVar(&d.Namespace, "discover-namespace", "", "kubernetes discovery: the workers' namespace (default: this pod's)")
	fs.StringVar(&d.Selector, "discover-selector", "", "kubernetes discovery: label selector of the workers' EndpointSlices, e.g. app.kubernetes.io/component=worker")
	fs.StringVar(&d.PortName, "discover-port-name", "worker", "kubernetes discovery: the EndpointSlice port the workers listen on (empty: the only one)")
	fs.StringVar(&d.Kubeconfig, "kubeconfig", "", "kubernetes discovery: a kubeconfig file (default: the pod's service account)")
}

// source builds the chosen discovery source; nil for register.
func (d *discoverFlags) source(log *slog.Logger) (discovery.Discovery, error) {
	switch d.Mode {
	case "", "register":
		return nil, nil
	case "static":
		return static.New(d.Workers)
	case "dns":
		src, err := dns.New(d.DNS, d.Interval, nil)
		if err != nil {
			return nil, err
		}
		src.OnError = func(err error) { log.Warn("dns discovery", "err", err) }
		return src, nil
	case "kubernetes":
		cfg := kubernetes.Config{Namespace: d.Namespace, Selector: d.Selector, PortName: d.PortName}
		cs, err := kubernetes.Clientset(d.Kubeconfig, &cfg)
		if err != nil {
			return nil, err
		}
		src, err := kubernetes.New(cs, cfg)
		if err != nil {
			return nil, err
		}
		src.OnError = func(err error) { log.Warn("kubernetes discovery", "err", err) }
		return src, nil
	default:
		return nil, fmt.Errorf("--discover %q: must be register, static, dns or kubernetes", d.Mode)
	}
}
