package api

import (
	"encoding/json"
	"testing"
)

// loss_fn_config takes booleans as 1 and 0 (twinkle's {"disable_lora": true}) besides numbers;
// anything else is refused.
func TestLossFnConfigTakesBooleans(t *testing.T) {
	var in ForwardBackwardInput
	if err := json.Unmarshal([]byte(`{"data":[],"loss_fn":"cross_entropy","loss_fn_config":{"disable_lora":true,"off":false,"beta":0.5}}`), &in); err != nil {
		t.Fatal(err)
	}
	if in.LossFn != "cross_entropy" || in.LossFnConfig["disable_lora"] != 1 || in.LossFnConfig["off"] != 0 || in.LossFnConfig["beta"] != 0.5 {
		t.Fatalf("decoded %+v", in)
	}
	for _, bad := range []string{`{"loss_fn_config":{"x":"yes"}}`, `{"loss_fn_config":{"x":[1]}}`, `{"loss_fn_config":{"x":null}}`} {
		if err := json.Unmarshal([]byte(bad), &in); err == nil {
			t.Fatalf("%s was accepted", bad)
		}
	}
}
