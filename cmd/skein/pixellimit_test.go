package main

import (
	"flag"
	"testing"
	"time"

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

// --max-request-image-bytes, --max-request-image-pixels and --image-decoders reach the
// gateway's options; 0 or less is refused for the two budgets (issue 19).
func TestRequestImageBudgetFlags(t *testing.T) {
	parse := func(args ...string) (*limitFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		l := addLimitFlags(fs)
		return l, fs.Parse(args)
	}
	l, err := parse("--max-request-image-bytes", "1000", "--max-request-image-pixels", "2000", "--image-decoders", "3")
	if err != nil || l.check() != nil {
		t.Fatalf("parse: %v", err)
	}
	if o := l.apply(gateway.Options{}); o.MaxRequestImageBytes != 1000 || o.MaxRequestImagePixels != 2000 || o.ImageDecoders != 3 {
		t.Fatalf("options %d %d %d", o.MaxRequestImageBytes, o.MaxRequestImagePixels, o.ImageDecoders)
	}
	if o := func() gateway.Options { l, _ := parse(); return l.apply(gateway.Options{}) }(); o.MaxRequestImageBytes != gateway.DefaultMaxRequestImageBytes || o.MaxRequestImagePixels != gateway.DefaultMaxRequestImagePixels || o.ImageDecoders != 0 {
		t.Fatalf("defaults not applied: %+v", o)
	}
	for _, bad := range [][]string{{"--max-request-image-bytes", "0"}, {"--max-request-image-pixels", "-1"}, {"--image-decoders", "-1"}} {
		if l, _ := parse(bad...); l.check() == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}

// --chat-template-timeout reaches the gateway's options; 0 is refused (issue 19).
func TestChatTemplateTimeoutFlag(t *testing.T) {
	parse := func(args ...string) *limitFlags {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		l := addLimitFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := parse("--chat-template-timeout", "750ms"); l.check() != nil || l.apply(gateway.Options{}).ChatTemplateTimeout != 750*time.Millisecond {
		t.Fatal("--chat-template-timeout not applied")
	}
	if parse().apply(gateway.Options{}).ChatTemplateTimeout != gateway.DefaultChatTemplateTimeout {
		t.Fatal("default not applied")
	}
	if parse("--chat-template-timeout", "0s").check() == nil {
		t.Fatal("0 accepted")
	}
}
