package main

import (
	"context"
	"errors"
)

func serve(ctx context.Context, args []string) error { return errors.New("serve: not implemented yet") }
