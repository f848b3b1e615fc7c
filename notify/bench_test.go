package notify_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
)

// BenchmarkSend measures one Send against the fake SendGrid and real
// Postgres: a first attempt (claim, collapse window, POST, complete) as the
// baseline, next to the attempts that now look the key up first: a retry
// after a lost answer that finds the message (claim, look-up, complete), and
// a re-entry of a claim that never posted (claim, look-up, window, POST,
// complete). Preparing each iteration's earlier attempt is not timed.
func BenchmarkSend(b *testing.B) {
	cases := []struct {
		name    string
		prepare func(b *testing.B, bb *bundle, m notify.Message)
	}{
		{"first attempt (baseline)", func(*testing.B, *bundle, notify.Message) {}},
		{"retry finds the message", func(b *testing.B, bb *bundle, m notify.Message) {
			bb.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
			_, err := bb.sender.Send(context.Background(), m)
			require.ErrorIs(b, err, notify.ErrUnconfirmed)
		}},
		{"re-entry without a post", func(b *testing.B, bb *bundle, m notify.Message) { crash(b, bb, m) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			bb := setup(b, nil)
			quiet, err := notify.NewSender(bb.claims, bb.pool, &notify.SenderOpts{APIKey: apiKey, From: "r@example.com",
				BaseURL: bb.url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(b, err)
			bb.sender = quiet
			ctx := context.Background()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				m := message(fmt.Sprint("o", i), "receipt")
				tc.prepare(b, bb, m)
				b.StartTimer()
				res, err := bb.sender.Send(ctx, m)
				if err != nil || res.MessageID == "" {
					b.Fatalf("send %d: %+v %v", i, res, err)
				}
			}
			b.StopTimer()
			require.Equal(b, b.N, bb.fake.Count(), "one message per key")
			b.ReportMetric(float64(bb.fake.Lookups())/float64(b.N), "lookups/op")
		})
	}
}
