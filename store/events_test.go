package store

import (
	"context"
	"testing"
	"time"
)

// The audit log and usage ledger: events come back by kind, tenant and window, oldest first,
// usage sums by hour, and the sweep drops old ones.
func TestEventsContract(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		h := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
		add := func(e Event) {
			t.Helper()
			if err := s.AddEvent(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		add(Event{Tenant: "a", At: h.Add(5 * time.Minute), Kind: EventAudit, Name: "checkpoint.save", TinkerPath: "tinker://r/weights/x"})
		add(Event{Tenant: "b", At: h.Add(6 * time.Minute), Kind: EventAudit, Name: "checkpoint.delete"})
		add(Event{Tenant: "a", At: h.Add(time.Minute), Kind: EventAudit, Name: "training_run.create", ModelID: "r"})
		add(Event{Tenant: "a", At: h.Add(time.Minute), Kind: EventUsage, Name: "training", SessionID: "s", BaseModel: "m", Amount: 10, Seconds: 0.5})
		add(Event{Tenant: "a", At: h.Add(50 * time.Minute), Kind: EventUsage, Name: "training", SessionID: "s", BaseModel: "m", Amount: 5, Seconds: 0.25})
		add(Event{Tenant: "a", At: h.Add(70 * time.Minute), Kind: EventUsage, Name: "training", SessionID: "s", BaseModel: "m", Amount: 7})
		add(Event{Tenant: "b", At: h.Add(2 * time.Minute), Kind: EventUsage, Name: "training", SessionID: "t", BaseModel: "m", Amount: 100})

		ev, err := s.Events(ctx, EventAudit, "a", h, h.Add(time.Hour), 100)
		if err != nil || len(ev) != 2 || ev[0].Name != "training_run.create" || ev[1].TinkerPath != "tinker://r/weights/x" || !ev[1].At.Equal(h.Add(5*time.Minute)) {
			t.Fatalf("audit of a: %+v %v", ev, err)
		}
		if all, _ := s.Events(ctx, EventAudit, "", h, h.Add(time.Hour), 100); len(all) != 3 {
			t.Fatalf("all audit: %+v", all)
		}
		if one, _ := s.Events(ctx, EventAudit, "", h, h.Add(time.Hour), 1); len(one) != 1 {
			t.Fatalf("limit 1: %+v", one)
		}
		b, err := s.UsageBuckets(ctx, "a", h, h.Add(2*time.Hour), 100)
		if err != nil || len(b) != 2 || !b[0].Hour.Equal(h) || b[0].Amount != 15 || b[0].Seconds != 0.75 || !b[1].Hour.Equal(h.Add(time.Hour)) || b[1].Amount != 7 {
			t.Fatalf("usage of a: %+v %v", b, err)
		}
		if b, _ := s.UsageBuckets(ctx, "", h, h.Add(time.Hour), 100); len(b) != 2 || b[0].Tenant != "b" || b[0].Amount != 100 {
			t.Fatalf("usage of all in the first hour (largest first): %+v", b)
		}
		// Pages: keyset on time, with the rows already taken at the page's last millisecond skipped,
		// so ties are neither lost nor repeated; filters by tenant and name prefix are in SQL.
		for i := range 5 {
			add(Event{Tenant: "c", At: h.Add(20 * time.Minute), Kind: EventAudit, Name: "checkpoint.set_ttl", Detail: string(rune('0' + i))})
		}
		add(Event{Tenant: "c", At: h.Add(21 * time.Minute), Kind: EventAudit, Name: "api_key.revoke"})
		var paged []Event
		q := EventQuery{Kind: EventAudit, Tenant: "c", From: h, To: h.Add(time.Hour), Limit: 2}
		for range 10 {
			page, err := s.EventPage(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			paged = append(paged, page...)
			if len(page) < q.Limit {
				break
			}
			last := page[len(page)-1].At
			if last.Equal(q.From) {
				q.Skip += len(page)
			} else {
				q.From, q.Skip = last, 0
				for _, e := range page {
					if e.At.Equal(last) {
						q.Skip++
					}
				}
			}
		}
		seen := map[string]bool{}
		for _, e := range paged {
			seen[e.Name+e.Detail] = true
		}
		if len(paged) != 6 || len(seen) != 6 || paged[5].Name != "api_key.revoke" {
			t.Fatalf("pages of 2: %+v", paged)
		}
		if ck, err := s.EventPage(ctx, EventQuery{Kind: EventAudit, NamePrefix: "checkpoint.", From: h, To: h.Add(time.Hour), Limit: 100}); err != nil || len(ck) != 7 {
			t.Fatalf("checkpoint events of all: %d %v", len(ck), err)
		}
		if ck, _ := s.EventPage(ctx, EventQuery{Kind: EventAudit, Tenant: "c", NamePrefix: "api_key.revoke", From: h, To: h.Add(time.Hour), Limit: 100}); len(ck) != 1 {
			t.Fatalf("one event name: %+v", ck)
		}
		n, err := s.SweepEvents(ctx, h.Add(3*time.Minute))
		if err != nil || n != 3 {
			t.Fatalf("swept %d %v", n, err)
		}
	})
}
