package effects

// Class is an effect class: what a duplicate run of a step does to the
// world, which decides how the step is made safe (docs/design.md, effects).
type Class string

// The effect classes.
const (
	// ClassAbsoluteWrite sets a value; a repeat writes the same value.
	ClassAbsoluteWrite Class = "absolute_write"
	// ClassRelativeWrite changes a value relative to itself (append,
	// increment); a repeat doubles it unless a unique constraint stops it.
	ClassRelativeWrite Class = "relative_write"
	// ClassExternalCreate creates something at a provider (a charge); a
	// repeat costs money unless the provider's idempotency key stops it.
	ClassExternalCreate Class = "external_create"
	// ClassIrreversibleSend sends something that cannot be taken back (an
	// email); a repeat reaches the customer twice.
	ClassIrreversibleSend Class = "irreversible_send"
)

// Valid reports whether c is one of the defined classes.
func (c Class) Valid() bool {
	switch c {
	case ClassAbsoluteWrite, ClassRelativeWrite, ClassExternalCreate, ClassIrreversibleSend:
		return true
	}
	return false
}
