package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3 is the S3-compatible backend: key k is the object PREFIX/k of BUCKET. Conditional writes
// are S3's own If-Match / If-None-Match on PutObject (AWS since 2024; MinIO, versitygw), so two
// writers of one pointer cannot both win: the loser gets 412.
type S3 struct {
	client  *s3.Client
	presign *s3.PresignClient
	bucket  string
	prefix  string // "" or ending in "/"
	where   string
}

// S3Options configure the S3 backend. Credentials and region come from the AWS SDK's standard
// chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws, web identity, IMDS).
type S3Options struct {
	// Endpoint overrides the service address, for S3-compatible servers (MinIO, versitygw, Ceph):
	// http(s)://host:port. Path-style addressing is used with it.
	Endpoint string
	// Region when the chain gives none (us-east-1).
	Region string
}

// ParseS3URL reads s3://bucket/prefix.
func ParseS3URL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("storage: %q: want s3://bucket/prefix", raw)
	}
	bucket, prefix = u.Host, strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := CheckKey(prefix); err != nil {
			return "", "", fmt.Errorf("storage: %q: prefix: %w", raw, err)
		}
	}
	return bucket, prefix, nil
}

// NewS3 opens s3://bucket/prefix. It makes no request: a bad credential shows at first use.
func NewS3(ctx context.Context, raw string, o S3Options) (*S3, error) {
	bucket, prefix, err := ParseS3URL(raw)
	if err != nil {
		return nil, err
	}
	if o.Endpoint != "" {
		if u, err := url.Parse(o.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("storage: endpoint %q: want http(s)://host:port", o.Endpoint)
		}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("storage: AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = o.Region
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
	}
	client := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
			so.UsePathStyle = true
		}
		// Checksums only where the API requires them: S3-compatible servers differ in the
		// trailing checksums the SDK adds by default.
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	if prefix != "" {
		prefix += "/"
	}
	where := "s3://" + bucket + "/" + prefix
	if o.Endpoint != "" {
		where += " at " + o.Endpoint
	}
	return &S3{client: client, presign: s3.NewPresignClient(client), bucket: bucket, prefix: prefix, where: where}, nil
}

func (s *S3) String() string { return s.where }

// Client is the SDK client, for tests that make their bucket.
func (s *S3) Client() *s3.Client { return s.client }

// Bucket is the backend's bucket.
func (s *S3) Bucket() string { return s.bucket }

func (s *S3) object(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// mapErr turns the SDK's errors into this package's.
func (s *S3) mapErr(key string, cond Cond, err error) error {
	var api smithy.APIError
	var resp interface{ HTTPStatusCode() int }
	status := 0
	if errors.As(err, &resp) {
		status = resp.HTTPStatusCode()
	}
	code := ""
	if errors.As(err, &api) {
		code = api.ErrorCode()
	}
	switch {
	case status == http.StatusPreconditionFailed || code == "PreconditionFailed",
		// A conditional write racing another on the same key (AWS: 409 ConditionalRequestConflict).
		code == "ConditionalRequestConflict" && cond != (Cond{}):
		return &ConditionError{Key: key, Cond: cond}
	case status == http.StatusNotFound || code == "NoSuchKey" || code == "NotFound":
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("storage: %s %s: %w", s.where, key, err)
}

func etag(p *string) string { return strings.Trim(aws.ToString(p), `"`) }

func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, Info{}, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &obj})
	if err != nil {
		return nil, Info{}, s.mapErr(key, Cond{}, err)
	}
	return out.Body, Info{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: etag(out.ETag), Modified: aws.ToTime(out.LastModified)}, nil
}

func (s *S3) Head(ctx context.Context, key string) (Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return Info{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &obj})
	if err != nil {
		return Info{}, s.mapErr(key, Cond{}, err)
	}
	return Info{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: etag(out.ETag), Modified: aws.ToTime(out.LastModified)}, nil
}

func (s *S3) Put(ctx context.Context, key string, body io.ReadSeeker, cond Cond) (Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return Info{}, err
	}
	size, err := body.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = body.Seek(0, io.SeekStart)
	}
	if err != nil {
		return Info{}, fmt.Errorf("storage: %s: %w", key, err)
	}
	in := &s3.PutObjectInput{Bucket: &s.bucket, Key: &obj, Body: body, ContentLength: aws.Int64(size)}
	switch {
	case cond.IfAbsent:
		in.IfNoneMatch = aws.String("*")
	case cond.IfMatch != "":
		in.IfMatch = aws.String(`"` + cond.IfMatch + `"`)
	}
	out, err := s.client.PutObject(ctx, in)
	if err != nil {
		return Info{}, s.mapErr(key, cond, err)
	}
	return Info{Key: key, Size: size, ETag: etag(out.ETag), Modified: time.Now()}, nil
}

func (s *S3) List(ctx context.Context, prefix string, limit int) ([]Info, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	full := s.prefix + prefix
	var out []Info
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &full})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s.mapErr(prefix, Cond{}, err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if CheckKey(key) != nil {
				continue // not written by skein: never handed on as a key
			}
			if len(out) == limit {
				return nil, fmt.Errorf("%w: %q has more than %d objects", ErrTooMany, prefix, limit)
			}
			out = append(out, Info{Key: key, Size: aws.ToInt64(o.Size), ETag: etag(o.ETag), Modified: aws.ToTime(o.LastModified)})
		}
	}
	return out, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &obj}); err != nil {
		if err := s.mapErr(key, Cond{}, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	obj, err := s.object(key)
	if err != nil {
		return "", err
	}
	if ttl <= 0 || ttl > MaxPresignTTL {
		return "", fmt.Errorf("storage: presigned URL lifetime %v outside (0, %v]", ttl, MaxPresignTTL)
	}
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &obj}, s3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("storage: presigning %s: %w", key, err)
	}
	return req.URL, nil
}
