// Verify a Hooklane webhook (Standard Webhooks signatures), Go standard library only.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

const tolerance = 5 * time.Minute

// VerifyWebhook returns nil if one of secrets signed exactly these raw body bytes.
func VerifyWebhook(body []byte, msgID, timestamp, signature string, secrets []string) error {
	if msgID == "" || timestamp == "" || signature == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature header")
	}
	sentAt, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not a number")
	}
	if age := time.Since(time.Unix(sentAt, 0)); age > tolerance || age < -tolerance {
		return errors.New("webhook-timestamp is more than 5 minutes away from now (replayed?)")
	}

	// Two secrets during a rotation: the old one and the new one.
	var expected [][]byte
	for _, secret := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil {
			return errors.New("a secret is not whsec_ followed by base64")
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(msgID + "." + timestamp + "."))
		mac.Write(body)
		expected = append(expected, mac.Sum(nil))
	}
	// "v1,<base64> v1,<base64>": one signature per secret during a rotation.
	for _, entry := range strings.Fields(signature) {
		if !strings.HasPrefix(entry, "v1,") {
			continue
		}
		received, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(entry, "v1,"))
		if err != nil {
			continue
		}
		for _, mac := range expected {
			if hmac.Equal(mac, received) {
				return nil
			}
		}
	}
	return errors.New("no signature matches: wrong secret, or the body is not the raw bytes received")
}

// go run verify.go BODY_FILE WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE SECRET [SECRET...]
func main() {
	if len(os.Args) < 6 {
		fmt.Println("usage: verify BODY_FILE WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE SECRET [SECRET...]")
		os.Exit(2)
	}
	body, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	if err := VerifyWebhook(body, os.Args[2], os.Args[3], os.Args[4], os.Args[5:]); err != nil {
		fmt.Println("invalid:", err)
		os.Exit(1)
	}
	fmt.Println("valid")
}
