package engine

import "testing"

// A pass holds what stepElemsPerToken predicts, not more: the estimate that sizes chunks
// (with its margin) bounds the measured peak, and is not loose by more than a third. The peak
// includes reused buffers, so a pass that kept every layer's backward temporaries, or that
// freed nothing before the end, would exceed it.
func TestStepMemoryMatchesEstimate(t *testing.T) {
	for _, arch := range []Arch{ArchLlama, ArchQwen3} {
		e := loadTiny(t, arch, Options{})
		if _, err := e.CreateAdapter("m", LoraConfig{Rank: 4, TrainAttn: true, TrainMLP: true, TrainUnembed: true}); err != nil {
			t.Fatal(err)
		}
		ids := make([]int, 300)
		for i := range ids {
			ids[i] = (i*37)%400 + 3
		}
		data := []Datum{textDatum(ids), textDatum(ids[:290]), textDatum(ids[:250])}
		if _, err := e.ForwardBackward("m", data, "cross_entropy", nil); err != nil {
			t.Fatal(err)
		}
		c := e.Config
		T := padLen(300)
		perToken := c.stepElemsPerToken(T)
		fixed := c.HiddenSize * (2*c.NumAttentionHeads*c.HeadDim + 2*c.NumKeyValueHeads*c.HeadDim + 3*c.IntermediateSize)
		estimate := 4 * (fixed + 3*T*(perToken+perToken/10))
		got := e.PeakStepBytes()
		t.Logf("%s: peak %d bytes, estimate %d", arch, got, estimate)
		if got > estimate || got < estimate*2/3 {
			t.Fatalf("%s: a pass of 3×%d tokens held %d bytes; the estimate is %d", arch, T, got, estimate)
		}
	}
}
