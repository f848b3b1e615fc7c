package refunds

// Fingerprint is fingerprint, for tests that claim a step's key as another
// owner would.
var Fingerprint = fingerprint
