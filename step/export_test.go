package step

// Admit exposes LocalGate.admit to the tests.
func (g *LocalGate) Admit(provider, tenant string) (func(), error) { return g.admit(provider, tenant) }
