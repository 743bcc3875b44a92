//! TLS for den's listeners and clients, with rustls and the ring provider.
//!
//! - The router serves https and wss from a PEM certificate chain and key
//!   (`--tls-cert`, `--tls-key`): [`server_config`].
//! - Workers and consoles verify the router against the system's roots plus any CA an
//!   operator names (`--ca-cert`, for a private CA or a self-signed router):
//!   [`trust_also`] once at start-up, then [`client_config`] for WebSocket connections and
//!   [`reqwest_roots`] for HTTP clients, so every client in a process trusts the same set.
//!
//! Only HTTP/1.1 is offered by ALPN: the router's HTTP server is built without HTTP/2,
//! and WebSockets (worker links, console feeds) upgrade over HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {what} {} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} {} holds no certificate: expected PEM blocks `-----BEGIN CERTIFICATE-----`",
            path.display()
        ));
    }
    Ok(certs)
}

/// The router's TLS settings from a PEM certificate chain (leaf first) and its private key
/// (PKCS#8, PKCS#1 or SEC1). Every error names the file and what was wrong with it.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = read_certs(cert, "TLS certificate")?;
    let key_bytes = std::fs::read(key)
        .map_err(|e| format!("cannot read the TLS key {}: {e}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        format!(
            "the TLS key {} holds no usable private key ({e}): expected a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block",
            key.display()
        )
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            format!(
                "the TLS key {} does not fit the certificate {}: {e}",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// CA certificates trusted beyond the system's, set once per process.
static EXTRA_ROOTS: OnceLock<(PathBuf, Vec<CertificateDer<'static>>)> = OnceLock::new();
static CLIENT: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();

/// Trusts the CA certificates in the PEM file `path` in addition to the system's roots,
/// for every client this process opens afterwards. Call before the first connection; a
/// second call with another file is refused (one process, one trust set).
pub fn trust_also(path: &Path) -> Result<(), String> {
    let certs = read_certs(path, "CA certificate")?;
    // Each must parse as a trust anchor now, not fail later on the first connection.
    let mut store = rustls::RootCertStore::empty();
    for c in &certs {
        store
            .add(c.clone())
            .map_err(|e| format!("the CA certificate {} is unusable: {e}", path.display()))?;
    }
    match EXTRA_ROOTS.get() {
        Some((set, _)) if set == path => Ok(()),
        Some((set, _)) => Err(format!(
            "a CA certificate is already set ({}); only one --ca-cert is taken",
            set.display()
        )),
        None => {
            let _ = EXTRA_ROOTS.set((path.to_owned(), certs));
            Ok(())
        }
    }
}

/// The CA file named by [`trust_also`], if any (for messages).
pub fn extra_ca_file() -> Option<&'static Path> {
    EXTRA_ROOTS.get().map(|(p, _)| p.as_path())
}

fn extra_roots() -> &'static [CertificateDer<'static>] {
    EXTRA_ROOTS.get().map(|(_, c)| c.as_slice()).unwrap_or(&[])
}

/// The client TLS settings every den client in this process uses: the system's roots
/// plus the `--ca-cert` ones. Built once; an error (no roots at all) is kept and repeated.
pub fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    CLIENT.get_or_init(build_client_config).clone()
}

fn build_client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in extra_roots() {
        // Checked by trust_also; a failure here cannot happen, and is not fatal.
        let _ = roots.add(c.clone());
    }
    let native = rustls_native_certs::load_native_certs();
    let (_added, ignored) = roots.add_parsable_certificates(native.certs);
    if ignored > 0 {
        tracing::debug!("{ignored} system CA certificates could not be parsed and were skipped");
    }
    if roots.is_empty() {
        return Err(
            "no CA certificates to verify the router with: the system has none and no --ca-cert was given"
                .to_owned(),
        );
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The `--ca-cert` roots for a reqwest client (`ClientBuilder::tls_certs_merge`), which
/// adds them to the system's.
pub fn reqwest_roots() -> Vec<reqwest::Certificate> {
    extra_roots()
        .iter()
        .filter_map(|c| reqwest::Certificate::from_der(c.as_ref()).ok())
        .collect()
}

/// A WebSocket connector for `url`: TLS with [`client_config`] for `wss:`, plain for
/// `ws:` (tokio-tungstenite picks by scheme when given `None`).
pub fn ws_connector(url: &str) -> Result<Option<tokio_tungstenite::Connector>, String> {
    if url.starts_with("wss:") {
        Ok(Some(tokio_tungstenite::Connector::Rustls(client_config()?)))
    } else {
        Ok(None)
    }
}

/// A WebSocket connection error in one line, with what to do when it is about trust.
pub fn explain_ws_error(e: &tokio_tungstenite::tungstenite::Error) -> String {
    explain_trust(e.to_string())
}

/// `text` (a client's connection error), with what to do appended when the router's
/// certificate was not accepted.
pub fn explain_trust(text: String) -> String {
    if text.contains("CaUsedAsEndEntity") {
        // `openssl req -x509` marks its certificate a CA unless told otherwise, and webpki
        // refuses a CA certificate as a server's own.
        return format!(
            "{text} (the router's certificate is a CA certificate: serve one made with basicConstraints=CA:FALSE, see the README's TLS section)"
        );
    }
    let about_trust = text.contains("certificate") || text.contains("UnknownIssuer");
    if !about_trust {
        return text;
    }
    match extra_ca_file() {
        Some(ca) => format!(
            "{text} (the router's certificate is not signed by the system's roots or by {})",
            ca.display()
        ),
        None => format!(
            "{text} (the router's certificate is not signed by a CA this host trusts: pass --ca-cert with its CA)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_and_malformed_files_are_named_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let e = server_config(&missing, &missing).unwrap_err();
        assert!(
            e.contains("nope.pem") && e.contains("TLS certificate"),
            "{e}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = server_config(&junk, &junk).unwrap_err();
        assert!(e.contains("holds no certificate"), "{e}");
        assert!(!e.contains('\n'));
        let e = trust_also(&junk).unwrap_err();
        assert!(
            e.contains("CA certificate") && e.contains("junk.pem"),
            "{e}"
        );
    }

    #[test]
    fn trust_failures_say_what_to_do_and_others_pass_through() {
        let e = explain_trust("invalid peer certificate: UnknownIssuer".into());
        assert!(e.contains("--ca-cert"), "{e}");
        let e = explain_trust("invalid peer certificate: Other(CaUsedAsEndEntity)".into());
        assert!(e.contains("CA:FALSE"), "{e}");
        assert_eq!(
            explain_trust("connection refused".into()),
            "connection refused"
        );
    }
}
