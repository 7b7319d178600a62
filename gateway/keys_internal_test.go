package gateway

import (
	"strings"
	"testing"
)

// Only the exact issued form parses: anything else is rejected before the store is asked.
func TestKeyIDParsesOnlyIssuedKeys(t *testing.T) {
	id, secret := strings.Repeat("a", keyIDHex), strings.Repeat("0", keySecretHex)
	if got, ok := keyID("tml-" + id + "_" + secret); !ok || got != id {
		t.Fatalf("keyID of a well-formed key = %q, %v", got, ok)
	}
	for _, bad := range []string{
		"", "tml-", "tml-anything", "tml-" + id + secret, "tml-" + id + "-" + secret,
		"tml-" + strings.ToUpper(id) + "_" + secret, "tml-" + id + "_" + secret + "0", "tml-" + id + "_" + secret[1:],
		"tmx-" + id + "_" + secret, "tml-" + id[:15] + "g_" + secret, "tml-" + id + "_" + secret[1:] + "z",
	} {
		if got, ok := keyID(bad); ok {
			t.Errorf("keyID(%q) = %q, accepted", bad, got)
		}
	}
}
