package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/outbox"
)

// Keys of the outbox.Request.Meta that EnqueueTx writes: the order's amount,
// which starters put in the run's summary without loading the order.
const (
	MetaAmountMinor = "amount_minor"
	MetaCurrency    = "currency"
)

// CreateAndEnqueueTx creates the order and enqueues its run's start (see
// EnqueueTx) in tx, so both commit or roll back together; an identical
// existing order returns created=false. It returns a *ValidationError for bad
// input, an error wrapping ErrConflict for an existing order with other
// details, and the database error otherwise; on error roll tx back.
func (s *Store) CreateAndEnqueueTx(ctx context.Context, tx pgx.Tx, o NewOrder) (order *Order, created bool, err error) {
	return s.CreateAndEnqueueOnTx(ctx, tx, o, "")
}

// CreateAndEnqueueOnTx is CreateAndEnqueueTx whose start request names the
// task queue the relay starts the run on ("": the relay's own).
func (s *Store) CreateAndEnqueueOnTx(ctx context.Context, tx pgx.Tx, o NewOrder, queue string) (order *Order, created bool, err error) {
	if s == nil {
		return nil, false, errors.New("create order: store is nil")
	}
	order, created, err = s.CreateTx(ctx, tx, o)
	if err != nil {
		return nil, false, err
	}
	req, err := StartRequest(NewOrderInput(order.TenantID, order.ID), order)
	if err == nil {
		req.TaskQueue = queue
		_, err = outbox.EnqueueTx(ctx, tx, req)
	}
	if err != nil {
		return nil, false, fmt.Errorf("create order %s/%s: enqueue order run: %w", order.TenantID, order.ID, err)
	}
	return order, created, nil
}

// EnqueueTx records in tx the start of in's order run (WorkflowName,
// in.WorkflowID(), in as payload); a non-nil order puts its amount in Meta for
// the run's summary. Enqueueing the same order again returns enqueued=false.
// It returns an error wrapping outbox.ErrInvalid when in does not validate,
// and the database error otherwise.
func EnqueueTx(ctx context.Context, tx pgx.Tx, in OrderInput, order *Order) (enqueued bool, err error) {
	req, err := StartRequest(in, order)
	if err != nil {
		return false, fmt.Errorf("enqueue order run: %w", err)
	}
	return outbox.EnqueueTx(ctx, tx, req)
}

// StartRequest returns the outbox request EnqueueTx records for in and
// order (which may be nil). It returns an error wrapping outbox.ErrInvalid
// when in does not validate.
func StartRequest(in OrderInput, order *Order) (outbox.Request, error) {
	if err := in.Validate(); err != nil {
		return outbox.Request{}, fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	payload, err := json.Marshal(in)
	if err != nil {
		return outbox.Request{}, fmt.Errorf("encode input of %s: %w", in.WorkflowID(), err)
	}
	req := outbox.Request{WorkflowType: WorkflowName, WorkflowID: in.WorkflowID(), Payload: payload, TenantID: in.TenantID}
	if order != nil && order.TenantID == in.TenantID && order.ID == in.OrderID {
		req.Meta = map[string]string{MetaAmountMinor: strconv.FormatInt(order.AmountMinor, 10), MetaCurrency: order.Currency}
	}
	return req, nil
}

// FromStartRequest reads back what EnqueueTx wrote: the run's input and, when
// Meta carries an amount, a partial order (TenantID, ID, AmountMinor,
// Currency). It returns an error wrapping outbox.ErrInvalid when req is not an
// order run's or its payload is not a valid input.
func FromStartRequest(req outbox.Request) (OrderInput, *Order, error) {
	if req.WorkflowType != WorkflowName {
		return OrderInput{}, nil, fmt.Errorf("%w: %s is a %s run, not an order run", outbox.ErrInvalid, req.WorkflowID, req.WorkflowType)
	}
	var in OrderInput
	if err := json.Unmarshal(req.Payload, &in); err != nil {
		return OrderInput{}, nil, fmt.Errorf("%w: decode input of %s: %w", outbox.ErrInvalid, req.WorkflowID, err)
	}
	if err := in.Validate(); err != nil {
		return OrderInput{}, nil, fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	amount, err := strconv.ParseInt(req.Meta[MetaAmountMinor], 10, 64)
	currency := req.Meta[MetaCurrency]
	if err != nil || currency == "" {
		return in, nil, nil
	}
	return in, &Order{TenantID: in.TenantID, ID: in.OrderID, AmountMinor: amount, Currency: currency}, nil
}
