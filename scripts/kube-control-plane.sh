#!/usr/bin/env bash
# Builds a real Kubernetes control plane for the gated tests (SKEIN_TEST_KUBE_APISERVER): etcd v3.7.0,
# kube-apiserver and kube-controller-manager v1.37.2 from the Go module proxy (no Docker, no downloads from
# GitHub), into ${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci}/kube, and prints that directory. Reused when all three
# binaries are there. Cold: see the design notes (issue 25) for measured times.
set -euo pipefail
out=${SKEIN_CI_CACHE:-$HOME/.cache/skein-ci}/kube
mkdir -p "$out"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] && [ -x "$out/etcd" ]; then
  echo "$out"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# etcd: a ten-line main over its embed package.
build_etcd() {
mkdir etcd && cd etcd
cat > go.mod <<'MOD'
module skeinetcd

go 1.26
MOD
cat > main.go <<'GO'
package main

import (
	"log"
	"net/url"
	"os"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	cfg := embed.NewConfig()
	cfg.Dir = os.Args[1]
	u, _ := url.Parse("http://127.0.0.1:" + os.Args[2])
	p, _ := url.Parse("http://127.0.0.1:" + os.Args[3])
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*p}, []url.URL{*p}
	cfg.InitialCluster = cfg.Name + "=" + p.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatal(err)
	}
	<-e.Server.ReadyNotify()
	log.Print("etcd ready")
	<-e.Err()
}
GO
go get go.etcd.io/etcd/server/v3@v3.7.0 >/dev/null
go mod tidy >/dev/null
start=$SECONDS
GOEXPERIMENT= nice -n 10 go build -o "$out/etcd.tmp" . && mv "$out/etcd.tmp" "$out/etcd"
echo "built etcd in $((SECONDS - start)) s" >&2
cd ..
}
[ -x "$out/etcd" ] || build_etcd

# kube-apiserver: k8s.io/kubernetes with every staging module replaced by its v0.37.2 release.
mkdir kube && cd kube
cat > go.mod <<'MOD'
module skeinkube

go 1.26

require k8s.io/kubernetes v1.37.2
MOD
gomod=$(go mod download -json k8s.io/kubernetes@v1.37.2 | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
grep -oE '^\s*k8s.io/[a-z0-9-]+ => \./staging/src/k8s.io/[a-z0-9-]+' "$gomod" | awk '{print $1}' | while read -r m; do
  echo "replace $m => $m v0.37.2" >> go.mod
done
printf 'package main\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"\n)\n\nfunc main() {}\n' > tools.go
go mod tidy >/dev/null
for cmd in kube-apiserver kube-controller-manager; do
  [ -x "$out/$cmd" ] && continue
  start=$SECONDS
  GOEXPERIMENT= nice -n 10 go build -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$out/$cmd.tmp" "$out/$cmd"
  echo "built $cmd in $((SECONDS - start)) s" >&2
done
echo "$out"
