// Package carrier is a client of a shipping carrier's label API: buying a
// label is an external create under an Idempotency-Key, and a label can be
// read back by ID.
package carrier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/keyedhq/keyed/effects"
)

// DefaultAPIBase is the carrier's API base URL.
const DefaultAPIBase = "https://api.carrier.example"

// Label is a bought shipping label.
type Label struct {
	ID       string `json:"id"`
	Tracking string `json:"tracking"`
	Order    string `json:"order"`
}

// Client calls the carrier's API with an API key.
type Client struct {
	key, base string
	http      *http.Client
}

// New returns a client of the API at base with key. It returns an error
// for an empty key or a base that is not an http(s) URL.
func New(key, base string, hc *http.Client) (*Client, error) {
	if key == "" {
		return nil, errors.New("carrier: no API key")
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("carrier: API base %q is not an http(s) URL", base)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{key: key, base: strings.TrimSuffix(base, "/"), http: hc}, nil
}

// Buy buys the label of order under idempotencyKey: a repeat with the same
// key returns the first label. A 429, a 5xx or a transport error is marked
// effects.Transient; any other refusal is a *RefusedError.
func (c *Client) Buy(ctx context.Context, idempotencyKey, order string) (Label, error) {
	body, err := json.Marshal(map[string]string{"order": order})
	if err != nil {
		return Label{}, fmt.Errorf("encode label request: %w", err)
	}
	return c.do(ctx, http.MethodPost, "/v1/labels", idempotencyKey, body)
}

// Get returns the label id.
func (c *Client) Get(ctx context.Context, id string) (Label, error) {
	return c.do(ctx, http.MethodGet, "/v1/labels/"+url.PathEscape(id), "", nil)
}

// RefusedError is the carrier's refusal of a request.
type RefusedError struct {
	Status int
	Body   string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("carrier refused: %d %s", e.Status, e.Body)
}

func (c *Client) do(ctx context.Context, method, path, idemKey string, body []byte) (Label, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return Label{}, fmt.Errorf("build carrier request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Label{}, effects.Transient(fmt.Errorf("call carrier: %w", err))
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Label{}, effects.Transient(fmt.Errorf("read carrier response: %w", err))
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return Label{}, effects.Transient(&RefusedError{Status: resp.StatusCode, Body: string(raw)})
	case resp.StatusCode >= 300:
		return Label{}, &RefusedError{Status: resp.StatusCode, Body: string(raw)}
	}
	var l Label
	if err := json.Unmarshal(raw, &l); err != nil {
		return Label{}, fmt.Errorf("decode carrier label: %w", err)
	}
	return l, nil
}
