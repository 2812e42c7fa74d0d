//! TLS for test servers: a throw-away certificate authority, a server certificate and a client
//! certificate, generated at run time with `rcgen` (no key files in the repository, no
//! `openssl` command), and a `redis-server` that also listens with TLS.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::{free_port, Launch, RedisServer};

/// PEM texts of one CA and the server and client certificates it signed.
pub struct Pki {
    pub ca_cert: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl Pki {
    /// A fresh CA named `name`, with a server certificate for `127.0.0.1` and `localhost` and a
    /// client certificate.
    pub fn generate(name: &str) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("self-signed CA");

        let leaf = |sans: Vec<String>, cn: &str, usage: Vec<ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::new(sans).expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = usage;
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &ca).expect("sign leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "redis-server",
            // Servers present it as clients too: the cluster bus, replication, Sentinel.
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            vec!["dlock-client".into()],
            "dlock-client",
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        Pki {
            ca_cert: ca.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// What a client needs to trust the server (and, if `with_client_cert`, to present its
    /// own certificate): the CA and optionally the client pair.
    pub fn client_certificates(&self, with_client_cert: bool) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: with_client_cert.then(|| redis::ClientTlsConfig {
                client_cert: self.client_cert.as_bytes().to_vec(),
                client_key: self.client_key.as_bytes().to_vec(),
            }),
            root_cert: Some(self.ca_cert.as_bytes().to_vec()),
        }
    }

    /// Writes the server's files into `dir`; returns (cert, key, CA) paths.
    fn write_server_files(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write TLS file");
            path
        };
        (
            write("server.crt", &self.server_cert),
            write("server.key", &self.server_key),
            write("ca.crt", &self.ca_cert),
        )
    }
}

/// The `redis-server` arguments for a TLS port `tls_port` with `pki`'s files written into
/// `dir`. With `require_client_cert`, clients must present a certificate the CA signed (mTLS).
pub fn tls_launch(pki: &Pki, dir: &Path, tls_port: u16, require_client_cert: bool) -> Launch {
    let (cert, key, ca) = pki.write_server_files(dir);
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    Launch {
        conf: None,
        args: vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            if require_client_cert { "yes" } else { "no" }.into(),
        ],
    }
}

impl RedisServer {
    /// A server that listens with TLS on a second free port as well as in plain text on
    /// [`port`](RedisServer::port) (which the fixture and the tests' own checks use).
    pub fn start_tls(pki: &Pki, require_client_cert: bool) -> RedisServer {
        Self::start_custom(|_, dir| tls_launch(pki, dir, free_port(), require_client_cert))
    }

    /// The TLS port of a server from [`start_tls`](RedisServer::start_tls).
    pub fn tls_port(&self) -> u16 {
        let args = &self.launch.args;
        args.iter()
            .position(|a| a == "--tls-port")
            .and_then(|i| args.get(i + 1))
            .and_then(|p| p.parse().ok())
            .expect("a server started with start_tls")
    }

    /// `rediss://127.0.0.1:TLS_PORT/`
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port())
    }
}

/// The arguments of [`tls_launch`] on a free TLS port, for servers started by other helpers
/// (a cluster's nodes: add `--tls-cluster yes`).
pub fn tls_args(pki: &Pki, dir: &Path, require_client_cert: bool) -> Vec<String> {
    tls_launch(pki, dir, free_port(), require_client_cert).args
}
