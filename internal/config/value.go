package config

import (
	"flag"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"
)

var (
	durationType = reflect.TypeFor[time.Duration]()
	levelType    = reflect.TypeFor[slog.Level]()
)

// field returns the Config field s fills, in c.
func (s *Setting) field(c *Config) reflect.Value {
	v := reflect.ValueOf(c).Elem()
	for _, name := range strings.Split(s.Field, ".") {
		v = v.FieldByName(name)
		if !v.IsValid() {
			panic("config: Settings row " + s.Env + ": Config has no field " + s.Field)
		}
	}
	return v
}

// defaultValue returns the default of s for role as a value of type t.
func (s *Setting) defaultValue(role Role, t reflect.Type) reflect.Value {
	d := s.Default
	if br, ok := d.(ByRole); ok {
		d = br.Starter
		if role == Worker {
			d = br.Worker
		}
	}
	if d == nil {
		return reflect.Zero(t)
	}
	return reflect.ValueOf(d).Convert(t)
}

// help returns Help without the flag package's backquotes.
func (s *Setting) help() string { return strings.ReplaceAll(s.Help, "`", "") }

// parse parses the variable's value s as a value of type t. The error
// quotes s without any credentials it holds.
func parse(t reflect.Type, s string) (reflect.Value, error) {
	var x any
	var err error
	switch {
	case t == durationType:
		if x, err = time.ParseDuration(s); err != nil {
			return reflect.Value{}, fmt.Errorf("%q is not a duration such as 30s or 10m", quote(s))
		}
	case t == levelType:
		if x, err = parseLevel(s); err != nil {
			return reflect.Value{}, err
		}
	case t.Kind() == reflect.String:
		x = s
	case t.Kind() == reflect.Bool:
		if x, err = strconv.ParseBool(s); err != nil {
			return reflect.Value{}, fmt.Errorf("%q is not true or false (also accepted: 1, 0, t, f)", quote(s))
		}
	case t.Kind() == reflect.Int:
		if x, err = strconv.Atoi(s); err != nil {
			return reflect.Value{}, fmt.Errorf("%q is not a whole number", quote(s))
		}
	case t.Kind() == reflect.Float64:
		if x, err = strconv.ParseFloat(s, 64); err != nil {
			return reflect.Value{}, fmt.Errorf("%q is not a number such as 100 or 0.5", quote(s))
		}
	default:
		panic("config: no parser for " + t.String())
	}
	return reflect.ValueOf(x).Convert(t), nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not debug, info, warn or error", quote(s))
}

// bindFlag adds the flag name for the field f to fs, defaulting to f's
// value.
func bindFlag(fs *flag.FlagSet, f reflect.Value, name, usage string) {
	switch p := f.Addr().Interface().(type) {
	case *string:
		fs.StringVar(p, name, *p, usage)
	case *bool:
		fs.BoolVar(p, name, *p, usage)
	case *int:
		fs.IntVar(p, name, *p, usage)
	case *float64:
		fs.Float64Var(p, name, *p, usage)
	case *time.Duration:
		fs.DurationVar(p, name, *p, usage)
	case *slog.Level:
		fs.Var((*levelFlag)(p), name, usage)
	default:
		panic("config: no flag for " + f.Type().String())
	}
}

// levelFlag is a slog.Level flag spelled as LOG_LEVEL is.
type levelFlag slog.Level

func (l *levelFlag) String() string { return strings.ToLower(slog.Level(*l).String()) }

func (l *levelFlag) Set(s string) error {
	v, err := parseLevel(strings.TrimSpace(s))
	*l = levelFlag(v)
	return err
}

// Get returns the level's name, so that help quotes its default.
func (l *levelFlag) Get() any { return l.String() }

// show returns v as usage and docs spell it: durations without trailing
// zero units ("10m", not "10m0s"), levels in lower case.
func show(v any) string {
	switch x := v.(type) {
	case time.Duration:
		s := x.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case slog.Level:
		return strings.ToLower(x.String())
	}
	return fmt.Sprint(v)
}
