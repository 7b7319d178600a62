package gateway

import (
	"context"
	"net/http/httptest"
	"testing"
)

// A submit's log line names the future it created: handlers answer with the typed
// api.FutureResponse, which noteResult must recognise.
func TestSubmitLogLineNamesItsFuture(t *testing.T) {
	info := &requestInfo{id: "req-1"}
	r := httptest.NewRequest("POST", "/api/v1/forward_backward", nil)
	r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
	noteResult(r, "t-abc", futureResponse(&future{id: "fut-7"}, "m"), nil)
	if info.future != "fut-7" || info.tenant != "t-abc" {
		t.Fatalf("request info %+v: want future fut-7 and tenant t-abc", info)
	}
}
