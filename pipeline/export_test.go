package pipeline

// NewDecider is newDecider for the tests of package pipeline_test.
var NewDecider = newDecider
