package main

import (
	"flag"
	"testing"

	"github.com/skein-ai/skein/gateway"
)

// --max-request-pixel-values reaches the gateway's options; 0 or less is refused.
func TestMaxRequestPixelValuesFlag(t *testing.T) {
	parse := func(args ...string) (*limitFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		l := addLimitFlags(fs)
		return l, fs.Parse(args)
	}
	l, err := parse("--max-request-pixel-values", "12345")
	if err != nil || l.check() != nil {
		t.Fatalf("parse: %v", err)
	}
	if o := l.apply(gateway.Options{}); o.MaxRequestPixelValues != 12345 {
		t.Fatalf("MaxRequestPixelValues %d", o.MaxRequestPixelValues)
	}
	if l, _ := parse(); l.apply(gateway.Options{}).MaxRequestPixelValues != gateway.DefaultMaxRequestPixelValues {
		t.Fatal("default not applied")
	}
	if l, _ := parse("--max-request-pixel-values", "0"); l.check() == nil {
		t.Fatal("0 accepted")
	}
}
