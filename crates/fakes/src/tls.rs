//! A throw-away certificate authority for tests: a CA certificate and a server certificate for
//! `127.0.0.1` / `localhost` signed by it, generated at test time with `rcgen`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

/// A CA and one server certificate it signed.
pub struct TestCa {
    /// The CA certificate (PEM): what a client must trust.
    pub ca_pem: String,
    /// The server certificate (PEM), for servers that are not ours (etcd).
    pub cert_pem: String,
    /// The server certificate's private key (PKCS#8 PEM).
    pub key_pem: String,
    /// The server's rustls config (certificate chain + key).
    pub server_config: Arc<ServerConfig>,
}

/// The files [`TestCa::write_pem_files`] wrote.
pub struct PemFiles {
    /// The CA certificate: what a client must trust.
    pub ca: PathBuf,
    /// The server certificate.
    pub cert: PathBuf,
    /// The server certificate's private key.
    pub key: PathBuf,
}

impl TestCa {
    /// Generates a CA named `name` and a server certificate for 127.0.0.1 and localhost.
    pub fn generate(name: &str) -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, name);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");

        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &ca, &ca_key).expect("server cert");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server TLS config");
        TestCa {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            server_config: Arc::new(config),
        }
    }

    /// Writes `ca.pem`, `server.pem` and `server.key` into `dir`.
    pub fn write_pem_files(&self, dir: &Path) -> PemFiles {
        let files = PemFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        std::fs::write(&files.ca, &self.ca_pem).unwrap();
        std::fs::write(&files.cert, &self.cert_pem).unwrap();
        std::fs::write(&files.key, &self.key_pem).unwrap();
        files
    }
}
