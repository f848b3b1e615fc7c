// Package fakecarrier is a fake of the shipping carrier's label API for
// tests and the demo: it keeps labels in memory and honours the
// Idempotency-Key of a purchase, as the real carrier does.
package fakecarrier

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/keyedhq/keyed/internal/carrier"
)

// Fake serves POST /v1/labels and GET /v1/labels/{id}.
type Fake struct {
	mu     sync.Mutex
	byKey  map[string]carrier.Label
	byID   map[string]carrier.Label
	bought int
	// FailNext, when positive, makes that many purchases answer 503 after
	// buying: the answer is lost, the label exists.
	FailNext int
}

// New returns an empty fake.
func New() *Fake {
	return &Fake{byKey: map[string]carrier.Label{}, byID: map[string]carrier.Label{}}
}

// Bought returns how many labels were bought (repeats of a key excluded).
func (f *Fake) Bought() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bought
}

// ServeHTTP implements the API.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		http.Error(w, `{"error":"no API key"}`, http.StatusUnauthorized)
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/labels":
		f.buy(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/labels/"):
		f.get(w, strings.TrimPrefix(r.URL.Path, "/v1/labels/"))
	default:
		http.NotFound(w, r)
	}
}

func (f *Fake) buy(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req struct{ Order string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || key == "" || req.Order == "" {
		http.Error(w, `{"error":"an order and an Idempotency-Key are required"}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	l, ok := f.byKey[key]
	if !ok {
		f.bought++
		l = carrier.Label{ID: fmt.Sprintf("lbl_%d", f.bought), Tracking: fmt.Sprintf("TRK%08d", f.bought), Order: req.Order}
		f.byKey[key], f.byID[l.ID] = l, l
	}
	lose := f.FailNext > 0
	if lose {
		f.FailNext--
	}
	f.mu.Unlock()
	if lose {
		http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, l)
}

func (f *Fake) get(w http.ResponseWriter, id string) {
	f.mu.Lock()
	l, ok := f.byID[id]
	f.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":"no such label"}`, http.StatusNotFound)
		return
	}
	writeJSON(w, l)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
