package engine

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkLongPromptJoinsADecode: a 4,096-token prompt arrives while 48 rows decode in a
// continuous loop (issue 39's target: no decode step more than 2× its usual time). The running
// rows' token times give each decode step's duration: "usual" is the median step before the
// arrival, "worst" the longest after it (through the newcomer's prefill, its joining the loop,
// and a second more); the newcomer's time to its first token is reported too (ttft). Two cases: the loop's slots already hold the newcomer ("fits": it joins
// after joinWaitSteps and is prefilled in chunks between decode steps), and a loop sized for
// short rows ("grows": joining would move every row into a larger loop, so it waits for the
// share or for the rows to end). The model is SKEIN_BENCH_MODEL; its context must hold 4,096 +
// 700 positions (the small preset's config says 2,048: a copy with max_position_embeddings
// raised serves, RoPE has no learned positions).
func BenchmarkLongPromptJoinsADecode(b *testing.B) {
	dir := os.Getenv("SKEIN_BENCH_MODEL")
	if dir == "" {
		b.Skip("SKEIN_BENCH_MODEL unset")
	}
	const long, rows, arriveAt = 4096, 48, 8
	chunks := []int{16, 64, DefaultPrefillChunk}
	if c, err := strconv.Atoi(os.Getenv("SKEIN_BENCH_CHUNK")); err == nil {
		chunks = []int{c}
	}
	for _, chunk := range chunks {
		e, err := Load(dir, Options{PrefillChunk: chunk})
		if err != nil {
			b.Fatal(err)
		}
		if e.Info().Config.MaxPositionEmbeddings < long+700 {
			b.Skipf("%s holds %d positions, fewer than %d", dir, e.Info().Config.MaxPositionEmbeddings, long+700)
		}
		for _, c := range []struct {
			name      string
			maxTokens int // the running rows': their loop's slots are their prompt plus this
		}{{"fits", long + 600}, {"grows", 600}} {
			if c.name == "grows" && chunk != DefaultPrefillChunk {
				continue // it joins once the rows have ended: the chunk changes nothing
			}
			b.Run(c.name+"/chunk"+strconv.Itoa(chunk), func(b *testing.B) {
				var ratio, ttft float64
				for range b.N {
					r, t := longPromptJoin(b, e, long, rows, arriveAt, c.maxTokens)
					ratio, ttft = max(ratio, r), max(ttft, t)
				}
				b.ReportMetric(ratio, "worst/usual-step")
				b.ReportMetric(ttft, "newcomer-ttft-s")
			})
		}
	}
}

// longPromptJoin runs one case and returns the worst step over the usual one, and the
// newcomer's time to its first token in seconds.
func longPromptJoin(b *testing.B, e *Engine, long, rows, arriveAt, maxTokens int) (float64, float64) {
	var mu sync.Mutex
	var stamps []time.Time // sample 0 of the running request: one per decode step
	var arrived, firstToken time.Time
	seed := int64(3)
	running := SampleRequest{Prompt: []int{5, 6, 7, 8, 9, 10, 11, 12}, NumSamples: rows,
		Params: SampleParams{MaxTokens: maxTokens, Temperature: 1, Seed: &seed}}
	running.OnToken = func(sample, _ int, _ float64) bool {
		mu.Lock()
		defer mu.Unlock()
		if sample == 0 {
			stamps = append(stamps, time.Now())
		}
		// Once the newcomer has its first token the running rows have shown what they do.
		return firstToken.IsZero() || time.Since(firstToken) < time.Second
	}
	prompt := make([]int, long)
	for i := range prompt {
		prompt[i] = (i*31+7)%400 + 3
	}
	newcomer := SampleRequest{Prompt: prompt, NumSamples: 1, Params: SampleParams{MaxTokens: 2, Temperature: 1, Seed: &seed}}
	newcomer.OnToken = func(int, int, float64) bool {
		mu.Lock()
		if firstToken.IsZero() {
			firstToken = time.Now()
		}
		mu.Unlock()
		return true
	}
	fail := func(r *SampleResult, err error) {
		if err != nil {
			b.Error(err)
		}
	}
	sent := false
	feed := func(int) []FedRequest {
		mu.Lock()
		defer mu.Unlock()
		if sent || len(stamps) < arriveAt {
			return nil
		}
		sent, arrived = true, time.Now()
		return []FedRequest{{Req: newcomer, Done: fail}}
	}
	if err := e.SampleContinuous(context.Background(), []FedRequest{{Req: running, Done: fail}}, feed); err != nil {
		b.Fatal(err)
	}
	if firstToken.IsZero() || arrived.IsZero() {
		b.Fatal("the newcomer never arrived or never drew a token")
	}
	var before, after []time.Duration
	for i := 1; i < len(stamps); i++ {
		gap := stamps[i].Sub(stamps[i-1])
		switch {
		case stamps[i].Before(arrived):
			before = append(before, gap)
		default: // until the rows stop, a second after the newcomer's first token: its join included
			after = append(after, gap)
		}
	}
	if len(before) == 0 {
		b.Fatal("no decode step before the arrival")
	}
	slices.Sort(before)
	usual := before[len(before)/2]
	worst := usual
	if len(after) > 0 {
		worst = slices.Max(after)
	}
	if os.Getenv("SKEIN_BENCH_GAPS") != "" {
		b.Logf("usual %v; %d steps after the arrival: %v", usual, len(after), after)
	}
	return float64(worst) / float64(usual), firstToken.Sub(arrived).Seconds()
}
