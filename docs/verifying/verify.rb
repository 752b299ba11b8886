# Verify a Hooklane webhook (Standard Webhooks signatures), Ruby standard library only.
require "openssl"

TOLERANCE_SECONDS = 5 * 60

class InvalidWebhook < StandardError; end

# Returns if one of `secrets` signed exactly these raw `body` bytes; raises InvalidWebhook otherwise.
def verify_webhook(body, msg_id, timestamp, signature, secrets)
  if [msg_id, timestamp, signature].any? { |value| value.nil? || value.empty? }
    raise InvalidWebhook, "missing webhook-id, webhook-timestamp or webhook-signature header"
  end
  raise InvalidWebhook, "webhook-timestamp is not a number" unless timestamp.match?(/\A[0-9]+\z/)
  if (Time.now.to_i - timestamp.to_i).abs > TOLERANCE_SECONDS
    raise InvalidWebhook, "webhook-timestamp is more than 5 minutes away from now (replayed?)"
  end

  signed = "#{msg_id}.#{timestamp}.".b + body.b
  # Two secrets during a rotation: the old one and the new one. unpack1("m0") is strict base64.
  expected = secrets.map do |secret|
    OpenSSL::HMAC.digest("SHA256", secret.delete_prefix("whsec_").unpack1("m0"), signed)
  end
  # "v1,<base64> v1,<base64>": one signature per secret during a rotation.
  signature.split(" ").each do |entry|
    version, encoded = entry.split(",", 2)
    next unless version == "v1" && encoded

    received = encoded.unpack1("m")
    matched = expected.any? do |mac|
      mac.bytesize == received.bytesize && OpenSSL.fixed_length_secure_compare(mac, received)
    end
    return if matched
  end
  raise InvalidWebhook, "no signature matches: wrong secret, or the body is not the raw bytes received"
end

# ruby verify.rb BODY_FILE WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE SECRET [SECRET...]
if $PROGRAM_NAME == __FILE__
  body_file, msg_id, timestamp, signature, *secrets = ARGV
  begin
    verify_webhook(File.binread(body_file), msg_id, timestamp, signature, secrets)
  rescue InvalidWebhook => e
    puts "invalid: #{e.message}"
    exit 1
  end
  puts "valid"
end
