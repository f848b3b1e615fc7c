package pipeline_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/pipeline"
)

// A tenant is its own fairness key; one longer than Temporal takes is
// keyed by its SHA-256, so that two long tenants stay apart.
func TestTenantPriority(t *testing.T) {
	t.Parallel()
	require.Equal(t, "acme", pipeline.TenantPriority("acme").FairnessKey)
	fits := strings.Repeat("a", pipeline.MaxFairnessKey)
	require.Equal(t, fits, pipeline.TenantPriority(fits).FairnessKey)
	long1, long2 := pipeline.TenantPriority(fits+"1").FairnessKey, pipeline.TenantPriority(fits+"2").FairnessKey
	require.Len(t, long1, pipeline.MaxFairnessKey)
	require.NotEqual(t, long1, long2)
	require.Zero(t, pipeline.TenantPriority("acme").PriorityKey, "the default priority")
}
