package gateway

import "fmt"

// MaxTTLSeconds bounds a checkpoint's ttl_seconds (100 years: as good as forever). Seconds past
// time.Duration's range (about 292 years) would wrap negative and expire a checkpoint the
// moment it was acknowledged.
const MaxTTLSeconds = 100 * 365 * 24 * 3600

// checkTTL validates an optional ttl_seconds (nil: the checkpoint never expires).
func checkTTL(ttl *int64) error {
	if ttl != nil && (*ttl <= 0 || *ttl > MaxTTLSeconds) {
		return fmt.Errorf("ttl_seconds must be in [1, %d] (or null), got %d", MaxTTLSeconds, *ttl)
	}
	return nil
}
