package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// classified checks that each activity declares a class and a step, and
// that its sampled recent claims carry keys of its declared shape.
func (r *run) classified(ctx context.Context) []Check {
	var out []Check
	for _, a := range r.o.Activities {
		out = append(out, r.classifiedOne(ctx, a))
	}
	return out
}

func (r *run) classifiedOne(ctx context.Context, a Activity) Check {
	c := Check{Name: CheckClassified, Subject: a.Name}
	switch {
	case !a.Class.Valid():
		c.Status, c.Evidence = StatusFail, fmt.Sprintf("declares effect class %q, which is not one of keyed's classes", a.Class)
		c.Fix = "declare its Class (absolute_write, relative_write, external_create or irreversible_send) in its Definition"
		return c
	case a.Step == "":
		c.Status, c.Evidence = StatusFail, "declares no effect key step"
		c.Fix = "declare the Step its effect key ends with in its Definition"
		return c
	}
	decl := fmt.Sprintf("class %s, step %s", a.Class, a.Step)
	if a.KeyShape == "" {
		c.Status, c.Evidence = StatusPass, decl+"; claims no key of its own"
		return c
	}
	if a.SelfGuarded {
		c.Status, c.Evidence = StatusPass, decl+"; self-guarded: claims no effect record, its own write under keys of the shape "+a.KeyShape+" is its record"
		return c
	}
	keys, err := r.sampleKeys(ctx, a.Step)
	if err != nil {
		return errorCheck(CheckClassified, a.Name, err, "check DATABASE_URL reaches keyed's schema")
	}
	var bad []string
	for _, k := range keys {
		if !shapeMatches(a.KeyShape, k) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		c.Status = StatusFail
		c.Evidence = fmt.Sprintf("%s; %d of %d sampled claims (last %s) have keys not of the shape %s, such as %s",
			decl, len(bad), len(keys), days(r.o.Window), a.KeyShape, strings.Join(bad[:min(3, len(bad))], ", "))
		c.Fix = "derive the key from the business event with its input's EffectKey(step) (orders.OrderInput, refunds.RefundInput); never from a message ID, an attempt or a fresh UUID"
		return c
	}
	c.Status = StatusPass
	c.Evidence = fmt.Sprintf("%s; %s (last %s) all of the shape %s", decl, plural(len(keys), "sampled claim"), days(r.o.Window), a.KeyShape)
	return c
}

// sampleKeys returns the keys of the most recent claims of kind step.
func (r *run) sampleKeys(ctx context.Context, step string) ([]string, error) {
	rows, err := r.deps.Pool.Query(ctx, `SELECT key FROM keyed_effects WHERE created_at >= $1 AND kind = $2
ORDER BY created_at DESC LIMIT $3`, r.since(), step, r.o.Sample)
	if err != nil {
		return nil, fmt.Errorf("sample %s claims: %w", step, err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("sample %s claims: %w", step, err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sample %s claims: %w", step, err)
	}
	return keys, nil
}

// shapeMatches reports whether key has the parts of shape, where a part
// in braces matches any non-empty part.
func shapeMatches(shape, key string) bool {
	sp, kp := strings.Split(shape, ":"), strings.Split(key, ":")
	if len(sp) != len(kp) {
		return false
	}
	for i, s := range sp {
		wild := strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}")
		if kp[i] == "" || (!wild && s != kp[i]) {
			return false
		}
	}
	return true
}

// timeouts compares each keyed activity's start-to-close timeout with the
// p99 of its single-attempt claims' claim-to-finish time.
func (r *run) timeouts(ctx context.Context) []Check {
	var out []Check
	for _, a := range r.o.Activities {
		if a.KeyShape == "" || a.SelfGuarded {
			continue // No records of its own to measure.
		}
		out = append(out, r.timeoutOne(ctx, a))
	}
	return out
}

func (r *run) timeoutOne(ctx context.Context, a Activity) Check {
	c := Check{Name: CheckTimeouts, Subject: a.Name}
	var n int
	var p99s float64
	err := r.deps.Pool.QueryRow(ctx, `SELECT count(*), coalesce(percentile_cont(0.99) WITHIN GROUP
	(ORDER BY extract(epoch FROM finished_at - created_at)), 0)
FROM keyed_effects WHERE created_at >= $1 AND kind = $2 AND attempts = 1 AND finished_at IS NOT NULL`,
		r.since(), a.Step).Scan(&n, &p99s)
	if err != nil {
		return errorCheck(CheckTimeouts, a.Name, fmt.Errorf("measure %s durations: %w", a.Step, err), "")
	}
	stc := a.Options.StartToCloseTimeout
	if n == 0 {
		c.Status = StatusPass
		c.Evidence = fmt.Sprintf("start-to-close %s; no finished single-attempt %s claims in the last %s to measure", days(stc), a.Step, days(r.o.Window))
		return c
	}
	p99 := time.Duration(p99s * float64(time.Second))
	if p99 < time.Millisecond {
		c.Status = StatusPass
		c.Evidence = fmt.Sprintf("start-to-close %s; the p99 claim-to-finish time of %s is under 1ms "+
			"(the claim and its outcome commit in one transaction)", days(stc), plural(n, "single-attempt "+a.Step+" claim"))
		return c
	}
	c.Status = ratio(stc, p99)
	c.Evidence = fmt.Sprintf("start-to-close %s is %s× the p99 claim-to-finish time %s of %s (last %s)",
		days(stc), times(float64(stc)/float64(p99)), days(p99), plural(n, "single-attempt "+a.Step+" claim"), days(r.o.Window))
	if c.Status != StatusPass {
		c.Evidence += "; attempts that outlive the timeout are retried while the first may still act"
		c.Fix = fmt.Sprintf("raise %s's StartToCloseTimeout (workflows.ActivityOptions) to at least 3× the p99, %s, or find why it got slow",
			a.Name, days(3*p99))
	}
	return c
}

// heartbeatEvery is how often effects.Do renews a lease as the activities set
// it: a third of the heartbeat timeout, at least 100ms.
func heartbeatEvery(hb time.Duration) time.Duration { return max(hb/3, 100*time.Millisecond) }

// lease compares the claim lease with how often it is renewed.
func (r *run) lease(context.Context) []Check {
	var out []Check
	lease := r.o.ClaimLease
	for _, a := range r.o.Activities {
		if a.KeyShape == "" || a.SelfGuarded {
			continue // No claim, no lease.
		}
		c := Check{Name: CheckLease, Subject: a.Name}
		if hb := a.Options.HeartbeatTimeout; hb > 0 {
			every := heartbeatEvery(hb)
			c.Status = ratio(lease, every)
			c.Evidence = fmt.Sprintf("claim lease %s is %.0f× the %s interval at which it is renewed (heartbeat timeout %s)",
				days(lease), float64(lease)/float64(every), days(every), days(hb))
			if c.Status != StatusPass {
				c.Fix = "raise the effects client's lease (effects.ClientOpts.Lease) to at least 3× the renewal interval, so a late renewal does not hand the claim to a racer"
			}
		} else {
			stc := a.Options.StartToCloseTimeout
			c.Status = StatusPass
			c.Evidence = fmt.Sprintf("claim lease %s covers the start-to-close timeout %s (no heartbeat: the lease is not renewed)", days(lease), days(stc))
			if lease < stc {
				c.Status = StatusFail
				c.Evidence = fmt.Sprintf("claim lease %s is shorter than the start-to-close timeout %s, and with no heartbeat it is never renewed: "+
					"a slow attempt can lose its claim to a racer while it still acts", days(lease), days(stc))
				c.Fix = "raise the lease above the start-to-close timeout, or give the activity a heartbeat timeout and renew through effects.Do"
			}
		}
		out = append(out, c)
	}
	return out
}
