package sr3.hadoop;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.InvalidKeySpecException;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * HTTPS to the peers: trust the cluster's CA only (fs.sr3.tls.ca) and, where peers require
 * one, present a client certificate (fs.sr3.tls.cert and fs.sr3.tls.secret.key, PKCS#8 as
 * {@code sr3 tls issue} writes it). Each setting is the PEM text itself (what {@code
 * spark_conf()} ships, so executors need no file) or the path of a file holding it. The JDK
 * does the TLS; host names are checked against the certificates' names.
 *
 * <p>The key's name has "secret" in it so that Spark's default {@code spark.redaction.regex}
 * hides its value wherever Spark shows or logs its conf (the UI's Environment page, its REST
 * API, the event log). Its former name, fs.sr3.tls.key, which Spark shows, is still read
 * when the new one is not set (a saved core-site.xml or spark-defaults.conf).
 */
final class Tls {
  static final String CONF_CA = "fs.sr3.tls.ca";
  static final String CONF_CERT = "fs.sr3.tls.cert";
  static final String CONF_KEY = "fs.sr3.tls.secret.key";
  static final String CONF_KEY_FORMER = "fs.sr3.tls.key";
  static final int PEM_CHARS_MAX = 1 << 20;
  private static final char[] NO_PASSWORD = new char[0];

  private Tls() {}

  /** The PEM text of a setting: the value itself, or the file it names. */
  static String pem(String name, String value) throws IOException {
    if (value.startsWith("-----BEGIN")) {
      return value;
    }
    Path path = Path.of(value);
    if (Files.size(path) > PEM_CHARS_MAX) {
      throw new IOException("sr3: " + name + ": " + value + " is above " + PEM_CHARS_MAX + " bytes");
    }
    return Files.readString(path, StandardCharsets.US_ASCII);
  }

  static SSLContext context(String caPem, String certPem, String keyPem) throws IOException {
    try {
      CertificateFactory factory = CertificateFactory.getInstance("X.509");
      KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
      trust.load(null, null);
      int count = 0;
      for (Certificate certificate : certificates(factory, caPem)) {
        trust.setCertificateEntry("ca-" + count++, certificate);
      }
      if (count == 0) {
        throw new IOException("sr3: " + CONF_CA + " holds no certificate");
      }
      TrustManagerFactory trusted =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      trusted.init(trust);
      KeyManager[] keys = null;
      if (!certPem.isEmpty() || !keyPem.isEmpty()) {
        if (certPem.isEmpty() || keyPem.isEmpty()) {
          throw new IOException("sr3: set both " + CONF_CERT + " and " + CONF_KEY);
        }
        List<Certificate> chain = new ArrayList<>(certificates(factory, certPem));
        if (chain.isEmpty()) {
          throw new IOException("sr3: " + CONF_CERT + " holds no certificate");
        }
        KeyStore own = KeyStore.getInstance(KeyStore.getDefaultType());
        own.load(null, null);
        own.setKeyEntry("client", privateKey(keyPem), NO_PASSWORD, chain.toArray(new Certificate[0]));
        KeyManagerFactory managers =
            KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        managers.init(own, NO_PASSWORD);
        keys = managers.getKeyManagers();
      }
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(keys, trusted.getTrustManagers(), null);
      return context;
    } catch (GeneralSecurityException e) {
      throw new IOException("sr3: TLS settings: " + e.getMessage(), e);
    }
  }

  private static Collection<? extends Certificate> certificates(
      CertificateFactory factory, String pem) throws GeneralSecurityException {
    return factory.generateCertificates(
        new ByteArrayInputStream(pem.getBytes(StandardCharsets.US_ASCII)));
  }

  private static PrivateKey privateKey(String pem) throws IOException, GeneralSecurityException {
    if (!pem.contains("-----BEGIN PRIVATE KEY-----")) {
      throw new IOException(
          "sr3: " + CONF_KEY + " must be a PKCS#8 key (BEGIN PRIVATE KEY), as sr3 tls issue writes");
    }
    String base64 =
        pem.replace("-----BEGIN PRIVATE KEY-----", "")
            .replace("-----END PRIVATE KEY-----", "")
            .replaceAll("\\s", "");
    PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(Base64.getDecoder().decode(base64));
    for (String algorithm : new String[] {"EC", "RSA"}) {
      try {
        return KeyFactory.getInstance(algorithm).generatePrivate(spec);
      } catch (InvalidKeySpecException e) {
        // try the next algorithm
      }
    }
    throw new IOException("sr3: " + CONF_KEY + " is neither an EC nor an RSA key");
  }
}
