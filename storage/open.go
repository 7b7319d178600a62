package storage

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// EndpointEnv names the variable that overrides the S3 endpoint when no flag does (the AWS SDK's
// own AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL work too).
const EndpointEnv = "SKEIN_S3_ENDPOINT"

// Open is the backend a --storage value names: "" the local data directory dataDir (today's
// layout: keys are paths under it), "s3://bucket/prefix" S3, with endpoint (or $SKEIN_S3_ENDPOINT)
// as the server's address for S3-compatible servers.
func Open(ctx context.Context, spec, dataDir, endpoint string) (Storage, error) {
	switch {
	case spec == "":
		return NewDir(dataDir)
	case strings.HasPrefix(spec, "s3://"):
		if endpoint == "" {
			endpoint = os.Getenv(EndpointEnv)
		}
		return NewS3(ctx, spec, S3Options{Endpoint: endpoint})
	}
	return nil, fmt.Errorf("storage: %q: want empty (the data directory) or s3://bucket/prefix", spec)
}

// Local returns the directory behind st when it is a local one ("" for object storage): there
// the engine can read and write a key's files in place, with no copy.
func Local(st Storage) string {
	if d, ok := st.(*Dir); ok {
		return d.Root()
	}
	return ""
}
