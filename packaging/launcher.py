"""Entry script of the one-file executable: busbar's own CLI (busbar.cli:main), after pointing OpenSSL
at the CA bundle the executable carries.

A `FROM scratch` image has no /etc/ssl, and the OpenSSL inside the executable looks for roots at the
build machine's compiled-in paths, so without this a TLS call to a real provider cannot verify. An
SSL_CERT_FILE the operator set always wins; the system's certificate directory (SSL_CERT_DIR or
OpenSSL's default) is still consulted, so a host's own roots keep working beside the bundle.
"""
import os
import sys

CA_BUNDLE = os.path.join("certs", "ca-certificates.crt")


def use_bundled_roots(env=os.environ) -> None:
    if env.get("SSL_CERT_FILE"):
        return
    path = os.path.join(getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(__file__))), CA_BUNDLE)
    if os.path.isfile(path):
        env["SSL_CERT_FILE"] = path


if __name__ == "__main__":
    use_bundled_roots()
    from busbar.cli import main
    sys.exit(main())
