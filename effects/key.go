package effects

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLen is the longest key, in bytes of its string form, that keyed
// accepts. It matches the limit Stripe puts on an Idempotency-Key, because the
// same string is sent there.
const MaxKeyLen = 255

// Separator joins a key's tenant and parts in its string form. Parts may not
// contain it, so every string form parses back to exactly one key.
const Separator = ":"

// ErrInvalidKey is wrapped by every error that NewKey, ParseKey and Key.With
// return for a malformed key. The concrete error is a *KeyError.
var ErrInvalidKey = errors.New("invalid effect key")

// KeyError says which part of a key is malformed and why. Part is 0 for the
// tenant, 1 for the first business part, and -1 for the key as a whole.
type KeyError struct {
	Part   int
	Value  string
	Reason string
}

func (e *KeyError) Error() string {
	switch {
	case e.Part < 0:
		return fmt.Sprintf("%s: %s", ErrInvalidKey, e.Reason)
	case e.Part == 0:
		return fmt.Sprintf("%s: tenant %q: %s", ErrInvalidKey, e.Value, e.Reason)
	default:
		return fmt.Sprintf("%s: part %d %q: %s", ErrInvalidKey, e.Part, e.Value, e.Reason)
	}
}

// Unwrap returns ErrInvalidKey.
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// Key names one effect: a tenant plus business parts; its string form,
// "acme:order:9f3a:charge", is stored and sent to providers as their
// idempotency key. Derive it from the business event, never from a message
// ID, an attempt number or a fresh UUID. The zero Key is invalid.
type Key struct {
	s      string
	tenant string
}

// NewKey builds a key for tenant from business parts. Tenant and each part
// must be non-empty printable ASCII without spaces or the separator ":". It
// returns a *KeyError wrapping ErrInvalidKey when they are not, when there
// are no parts, or when the string form exceeds MaxKeyLen bytes.
func NewKey(tenant string, parts ...string) (Key, error) {
	if err := checkPart(0, tenant); err != nil {
		return Key{}, err
	}
	if len(parts) == 0 {
		return Key{}, &KeyError{Part: -1, Reason: "a key needs at least one part after the tenant"}
	}
	for i, p := range parts {
		if err := checkPart(i+1, p); err != nil {
			return Key{}, err
		}
	}
	s := tenant + Separator + strings.Join(parts, Separator)
	if len(s) > MaxKeyLen {
		return Key{}, &KeyError{Part: -1, Reason: fmt.Sprintf("%d bytes, longer than the %d allowed", len(s), MaxKeyLen)}
	}
	return Key{s: s, tenant: tenant}, nil
}

// MustKey is like NewKey but panics on a malformed key. Use it only for keys
// built from constants, such as in tests.
func MustKey(tenant string, parts ...string) Key {
	k, err := NewKey(tenant, parts...)
	if err != nil {
		panic(err)
	}
	return k
}

// ParseKey parses the string form of a key. It returns a *KeyError wrapping
// ErrInvalidKey for anything NewKey would refuse.
func ParseKey(s string) (Key, error) {
	if len(s) > MaxKeyLen {
		return Key{}, &KeyError{Part: -1, Reason: fmt.Sprintf("%d bytes, longer than the %d allowed", len(s), MaxKeyLen)}
	}
	fields := strings.Split(s, Separator)
	return NewKey(fields[0], fields[1:]...)
}

// With returns a key with more parts appended, such as the "charge" step of
// an order's key. It returns a *KeyError like NewKey.
func (k Key) With(parts ...string) (Key, error) {
	if k.IsZero() {
		return Key{}, &KeyError{Part: -1, Reason: "cannot extend the zero key"}
	}
	return NewKey(k.tenant, append(k.Parts(), parts...)...)
}

// String returns the key's string form, "tenant:part:part".
func (k Key) String() string { return k.s }

// Tenant returns the tenant the key is scoped to.
func (k Key) Tenant() string { return k.tenant }

// Parts returns the business parts after the tenant.
func (k Key) Parts() []string {
	if k.IsZero() {
		return nil
	}
	return strings.Split(k.s[len(k.tenant)+1:], Separator)
}

// IsZero reports whether k is the zero Key.
func (k Key) IsZero() bool { return k.s == "" }

// MarshalText implements encoding.TextMarshaler.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.s), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseKey's rules.
func (k *Key) UnmarshalText(b []byte) error {
	parsed, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = parsed
	return nil
}

func checkPart(i int, p string) error {
	if p == "" {
		return &KeyError{Part: i, Value: p, Reason: "empty"}
	}
	for j := 0; j < len(p); j++ {
		c := p[j]
		switch {
		case c == Separator[0]:
			return &KeyError{Part: i, Value: p, Reason: fmt.Sprintf("contains the separator %q at byte %d", Separator, j)}
		case c <= ' ' || c >= 0x7f:
			return &KeyError{Part: i, Value: p, Reason: fmt.Sprintf("byte %d is 0x%02x; only printable ASCII without spaces is allowed", j, c)}
		}
	}
	return nil
}
