package orders

import (
	"fmt"
	"strings"
)

// MaxIDBytes bounds an order's ID and a refund's.
const MaxIDBytes = 64

// RefundKeyRoom is what the effect key of a refund of an order adds to the
// order's key: ":refund:", a refund ID of up to MaxIDBytes, ':' and a
// refund step's name of up to 16 bytes (package refunds, whose tests hold
// its steps to it). NewOrder.Validate keeps that room, so that every order
// that can be charged can be refunded.
const RefundKeyRoom = len(":refund:") + MaxIDBytes + len(":") + 16

// CheckID returns why id cannot name an order or a refund, or "" if it
// can. An ID is 1 to MaxIDBytes bytes of printable ASCII without spaces,
// ':' (it is a part of effect keys and workflow IDs) or '/', and not only
// dots: it names one segment of a path such as /v1/orders/{id}. The reason
// never quotes the ID.
func CheckID(id string) string {
	switch {
	case id == "":
		return "empty"
	case len(id) > MaxIDBytes:
		return fmt.Sprintf("%d bytes, longer than the %d allowed", len(id), MaxIDBytes)
	case strings.Trim(id, ".") == "":
		return "only dots: it names one segment of a path such as /v1/orders/{id}"
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c <= ' ' || c >= 0x7f:
			return fmt.Sprintf("byte %d is 0x%02x: only printable ASCII without spaces, ':' or '/' is allowed", i, c)
		case c == ':' || c == '/':
			return fmt.Sprintf("holds %q at byte %d: only printable ASCII without spaces, ':' or '/' is allowed", c, i)
		}
	}
	return ""
}
