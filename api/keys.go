package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
)

// The environment variables of the keys, which internal/config reads for
// starter serve.
const (
	// EnvKeys holds the API keys inline: "acme=sk_acme_…,globex=sk_globex_…".
	EnvKeys = "KEYED_API_KEYS"
	// EnvKeysFile names a file holding one "tenant=key" per line.
	EnvKeysFile = "KEYED_API_KEYS_FILE"
)

// MinKeyLen is the shortest API key accepted: 16 bytes, so that a key
// cannot be guessed by trying.
const MinKeyLen = 16

// ErrNoKeys means no API key is configured: neither EnvKeys nor EnvKeysFile
// is set, or they hold no entry.
var ErrNoKeys = errors.New("no API keys configured")

// ErrBadKeys is wrapped by every error about a malformed key list. The
// errors name the entry by its position and tenant, never by the key.
var ErrBadKeys = errors.New("bad API key configuration")

// Keys maps bearer API keys to tenants, keeping only SHA-256 digests and
// comparing in constant time. A tenant may have several keys. Keys is safe
// for concurrent use.
type Keys struct {
	entries []keyEntry
}

// MaxTenantLen is the longest tenant ParseKeys accepts, 171 bytes: the
// effect key of any Idempotency-Key, "TENANT:idempotency-sha256:<64 hex>",
// must fit in effects.MaxKeyLen, and so then does every order's.
const MaxTenantLen = effects.MaxKeyLen - len(":idempotency-sha256:") - 2*sha256.Size

type keyEntry struct {
	digest [sha256.Size]byte
	tenant string
}

// ParseKeys parses "tenant=key" entries separated by commas or newlines
// (spaces, blank lines and # lines ignored). Tenants are effect-key parts of
// at most MaxTenantLen bytes, no two differing only in case; keys are bearer
// tokens (RFC 6750: letters, digits and -._~+/, then = padding) of at least
// MinKeyLen bytes. It returns an error wrapping ErrBadKeys for a bad entry
// or a key given to two tenants, and ErrNoKeys for no entries.
func ParseKeys(s string) (*Keys, error) {
	k := &Keys{}
	seen := map[[sha256.Size]byte]string{}
	folded := map[string]string{} // lower-cased tenant -> tenant
	n := 0
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, entry := range strings.Split(line, ",") {
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			n++
			tenant, key, ok := strings.Cut(entry, "=")
			tenant, key = strings.TrimSpace(tenant), strings.TrimSpace(key)
			if !ok || tenant == "" || key == "" {
				return nil, fmt.Errorf("%w: entry %d: want tenant=key", ErrBadKeys, n)
			}
			if len(tenant) > MaxTenantLen {
				return nil, fmt.Errorf("%w: entry %d: tenant %.24q… (%d bytes) is too long: at most %d bytes", ErrBadKeys, n, tenant, len(tenant), MaxTenantLen)
			}
			if _, err := idempotency.StoredKey(tenant, ":"); err != nil { // the longest effect key of an Idempotency-Key
				return nil, fmt.Errorf("%w: entry %d: tenant %q is not a valid effect-key part", ErrBadKeys, n, tenant)
			}
			if len(key) < MinKeyLen {
				return nil, fmt.Errorf("%w: entry %d (tenant %s): key is shorter than %d bytes", ErrBadKeys, n, tenant, MinKeyLen)
			}
			if i := badKeyByte(key); i >= 0 {
				return nil, fmt.Errorf("%w: entry %d (tenant %s): key has a byte outside a bearer token's letters, digits and -._~+/ (then = padding) at %d; "+
					"entries are separated by commas or newlines, and quotes are part of the key", ErrBadKeys, n, tenant, i)
			}
			if other, ok := folded[strings.ToLower(tenant)]; ok && other != tenant {
				return nil, fmt.Errorf("%w: entry %d: tenants %s and %s differ only in case; tenants are case-sensitive, so use one spelling", ErrBadKeys, n, other, tenant)
			}
			folded[strings.ToLower(tenant)] = tenant
			d := sha256.Sum256([]byte(key))
			if other, dup := seen[d]; dup {
				if other == tenant {
					continue
				}
				return nil, fmt.Errorf("%w: entry %d: one key is configured for tenants %s and %s", ErrBadKeys, n, other, tenant)
			}
			seen[d] = tenant
			k.entries = append(k.entries, keyEntry{digest: d, tenant: tenant})
		}
	}
	if len(k.entries) == 0 {
		return nil, ErrNoKeys
	}
	return k, nil
}

// badKeyByte returns the index of the first byte of key outside RFC 6750's
// b64token (letters, digits, -._~+/, then only = to the end), or -1. A key
// outside it is a mistake in the list, such as entries separated by ";" or
// a key in quotes, which no client's Bearer header would match.
func badKeyByte(key string) int {
	padding := false
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '=':
			padding = true
		case padding:
			return i
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._~+/", c) >= 0:
		default:
			return i
		}
	}
	return -1
}

// LoadKeysFile reads a key list in ParseKeys's format from path. It returns
// the read error, or ParseKeys's.
func LoadKeysFile(path string) (*Keys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read API keys: %w", err)
	}
	k, err := ParseKeys(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// KeysFrom loads the keys from the file named file if it is set, else
// from the list inline (ParseKeys's format): starter serve passes
// KEYED_API_KEYS_FILE and KEYED_API_KEYS (EnvKeysFile, EnvKeys). It returns
// an error wrapping ErrNoKeys when both are empty, one wrapping ErrBadKeys
// when both are set, and LoadKeysFile's or ParseKeys's errors otherwise.
// Error messages never contain a key.
func KeysFrom(inline, file string) (*Keys, error) {
	inline, file = strings.TrimSpace(inline), strings.TrimSpace(file)
	switch {
	case file != "" && inline != "":
		return nil, fmt.Errorf("%w: set %s or %s, not both", ErrBadKeys, EnvKeys, EnvKeysFile)
	case file != "":
		return LoadKeysFile(file)
	case inline != "":
		return ParseKeys(inline)
	}
	return nil, fmt.Errorf("%w: set %s (tenant=key,…) or %s", ErrNoKeys, EnvKeys, EnvKeysFile)
}

// Tenant returns the tenant that key belongs to. It compares key's digest
// with every configured digest without stopping at a match, so the time
// taken does not depend on which key, if any, matched.
func (k *Keys) Tenant(key string) (tenant string, ok bool) {
	if k == nil || key == "" {
		return "", false
	}
	d := sha256.Sum256([]byte(key))
	found := -1
	for i := range k.entries {
		eq := subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return "", false
	}
	return k.entries[found].tenant, true
}

// Tenants returns the configured tenants, sorted, without duplicates.
func (k *Keys) Tenants() []string {
	set := map[string]bool{}
	for _, e := range k.entries {
		set[e.tenant] = true
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// String describes the key set without revealing any key.
func (k *Keys) String() string {
	return fmt.Sprintf("%d API keys for tenants %s", len(k.entries), strings.Join(k.Tenants(), ","))
}
