package migrations

// StatementsForTest exposes statements to the external tests.
var StatementsForTest = statements
