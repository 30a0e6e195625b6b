package sr3.hadoop;

/** Prints the signature of one request, to check it against the Python signer. */
public final class SignCheck {
  private SignCheck() {}

  public static void main(String[] args) {
    if (args.length != 7) {
      System.err.println(
          "usage: SignCheck SECRET_OR_CREDENTIAL METHOD TARGET PATH_QS TIMESTAMP NONCE SHA256");
      System.exit(2);
    }
    Signer signer = Signer.of(args[0]);
    System.out.println(
        signer.signature(args[1], args[2], args[3], Long.parseLong(args[4]), args[5], args[6]));
  }
}
