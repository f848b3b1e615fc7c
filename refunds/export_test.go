package refunds

// QueuedRefundsSQL is the statement that lists an order's queued refunds.
const QueuedRefundsSQL = queuedRefundsSQL
