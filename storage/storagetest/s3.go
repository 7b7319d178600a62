// Package storagetest gives tests a real S3 backend: a fresh prefix in a bucket made once per
// test binary on the server $SKEIN_TEST_S3 names (.ci/run starts versitygw on loopback and sets
// it, with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). Tests skip, saying so, without it.
package storagetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/skein-ai/skein/storage"
)

// EndpointEnv names the test S3 server's endpoint variable.
const EndpointEnv = "SKEIN_TEST_S3"

var (
	bucketOnce sync.Once
	bucketName string
	bucketErr  error
)

// Endpoint is the test server's endpoint; the test is skipped when there is none.
func Endpoint(t testing.TB) string {
	t.Helper()
	endpoint := os.Getenv(EndpointEnv)
	if endpoint == "" {
		t.Skip(EndpointEnv + " is not set (an S3 endpoint such as http://127.0.0.1:7070, with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; .ci/run starts versitygw for it)")
	}
	return endpoint
}

// URL is s3://bucket/prefix of a fresh prefix in the test bucket.
func URL(t testing.TB) string {
	t.Helper()
	endpoint := Endpoint(t)
	ctx := context.Background()
	bucketOnce.Do(func() {
		bucketName = "skein-test-" + randHex(4)
		var st *storage.S3
		if st, bucketErr = storage.NewS3(ctx, "s3://"+bucketName, storage.S3Options{Endpoint: endpoint}); bucketErr == nil {
			_, bucketErr = st.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucketName})
		}
	})
	if bucketErr != nil {
		t.Fatalf("making the test bucket on %s: %v", endpoint, bucketErr)
	}
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return "s3://" + bucketName + "/" + name + "-" + randHex(3)
}

// S3 opens a fresh prefix of the test bucket.
func S3(t testing.TB) *storage.S3 {
	t.Helper()
	u := URL(t)
	st, err := storage.NewS3(context.Background(), u, storage.S3Options{Endpoint: Endpoint(t)})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
