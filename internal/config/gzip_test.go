package config_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	grpcgzip "google.golang.org/grpc/encoding/gzip"

	"github.com/keyedhq/keyed/internal/config"
)

// UseFastGzip makes gRPC's gzip compressor write what gzip.BestSpeed
// writes, byte for byte.
func TestUseFastGzip(t *testing.T) {
	config.UseFastGzip()
	msg := []byte(strings.Repeat(`{"tenant_id":"acme","order_id":"9f3a","status":"succeeded"}`, 40))
	compress := func(open func(io.Writer) (io.WriteCloser, error)) []byte {
		var buf bytes.Buffer
		w, err := open(&buf)
		require.NoError(t, err)
		_, err = w.Write(msg)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		return buf.Bytes()
	}
	fastest := func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriterLevel(w, gzip.BestSpeed) }
	require.Equal(t, compress(fastest), compress(encoding.GetCompressor(grpcgzip.Name).Compress))
}
