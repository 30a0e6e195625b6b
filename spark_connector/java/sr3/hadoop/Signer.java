package sr3.hadoop;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Signs requests as sr3's Python client does (ring/auth.py, scheme SR3-HMAC-SHA256):
 * HMAC-SHA256 over METHOD, target, path and query, timestamp, nonce and the body's
 * SHA-256, with the key derived from the cluster secret, or with a scoped credential's
 * key (then its claims go in X-SR3-Credential).
 */
final class Signer {
  static final String SCHEME = "SR3-HMAC-SHA256";
  static final String CREDENTIAL_SCHEME = "sr3c1";
  static final int SECRET_CHARS_MIN = 16;
  private static final SecureRandom RANDOM = new SecureRandom();

  private final byte[] key;
  private final String claims; // null when signing with the cluster secret

  private Signer(byte[] key, String claims) {
    this.key = key;
    this.claims = claims;
  }

  /** A signer from a scoped credential ("sr3c1.CLAIMS.KEY") or the cluster secret. */
  static Signer of(String credentialOrSecret) {
    String text = credentialOrSecret.trim();
    if (text.startsWith(CREDENTIAL_SCHEME + ".")) {
      String[] parts = text.split("\\.", -1);
      if (parts.length != 3 || parts[1].isEmpty() || parts[2].isEmpty()) {
        throw new IllegalArgumentException("a scoped credential reads sr3c1.<claims>.<key>");
      }
      byte[] raw;
      try {
        raw = Base64.getUrlDecoder().decode(parts[2]);
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("malformed credential: the key is not base64url", e);
      }
      if (raw.length != 32) {
        throw new IllegalArgumentException("malformed credential: the key is 32 bytes");
      }
      return new Signer(raw, parts[1]);
    }
    if (text.length() < SECRET_CHARS_MIN) {
      throw new IllegalArgumentException(
          "the cluster secret must be at least " + SECRET_CHARS_MIN + " characters");
    }
    return new Signer(
        hmac(text.getBytes(StandardCharsets.UTF_8), "sr3-request-signing-v1"), null);
  }

  static byte[] hmac(byte[] key, String message) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(key, "HmacSHA256"));
      return mac.doFinal(message.getBytes(StandardCharsets.UTF_8));
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("HmacSHA256 is unavailable", e);
    }
  }

  /** The Authorization value for one canonical request. */
  String signature(
      String method, String target, String pathQs, long timestamp, String nonce, String bodySha256) {
    String canonical =
        String.join(
            "\n", method.toUpperCase(), target, pathQs, Long.toString(timestamp), nonce, bodySha256);
    return SCHEME + " " + HexFormat.of().formatHex(hmac(key, canonical));
  }

  /** The signing headers of a request to the peer at {@code target} (host:port). */
  Map<String, String> headers(String method, String target, String pathQs, String bodySha256) {
    long timestamp = System.currentTimeMillis() / 1000;
    byte[] nonceBytes = new byte[16];
    RANDOM.nextBytes(nonceBytes);
    String nonce = HexFormat.of().formatHex(nonceBytes);
    Map<String, String> headers = new LinkedHashMap<>();
    headers.put("X-SR3-Target", target);
    headers.put("X-SR3-Timestamp", Long.toString(timestamp));
    headers.put("X-SR3-Nonce", nonce);
    headers.put("X-SR3-Content-SHA256", bodySha256);
    headers.put("Authorization", signature(method, target, pathQs, timestamp, nonce, bodySha256));
    if (claims != null) {
      headers.put("X-SR3-Credential", claims);
    }
    return headers;
  }

  boolean scoped() {
    return claims != null;
  }
}
