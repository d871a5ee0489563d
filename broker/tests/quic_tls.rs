//! TLS identity on disk: the self-signed certificate is generated once and reused, its key
//! is private, and configured PEM files load. No sockets, no executors.

use std::os::unix::fs::PermissionsExt;

use sluice_broker::quic::tls::{self, Provenance, ServerIdentity, ServerTlsOptions};

#[test]
fn self_signed_certificate_is_generated_once_and_reused_on_later_starts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");

    let (first, provenance) = tls::load_or_create_self_signed(&data_dir).expect("first start");
    assert_eq!(provenance, Provenance::Generated);
    let cert_path = data_dir.join(tls::SELF_SIGNED_CERT_FILE);
    let key_path = data_dir.join(tls::SELF_SIGNED_KEY_FILE);
    assert!(cert_path.is_file() && key_path.is_file());
    let key_mode = std::fs::metadata(&key_path)
        .expect("key metadata")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(
        key_mode, 0o600,
        "the private key is readable by its owner only"
    );

    let (second, provenance) = tls::load_or_create_self_signed(&data_dir).expect("second start");
    assert_eq!(provenance, Provenance::Reused);
    assert_eq!(first.cert_chain, second.cert_chain, "same certificate");
    assert_eq!(
        first.key.secret_der(),
        second.key.secret_der(),
        "same private key"
    );

    // A client that pinned the first start's certificate still gets a usable config, and the
    // server config builds from the reused files.
    tls::client_config_trusting(&first.cert_chain, None).expect("client config");
    let options = ServerTlsOptions {
        identity: ServerIdentity::SelfSigned {
            data_dir: data_dir.clone(),
        },
        client_ca_path: None,
        client_cert_accounts: Default::default(),
    };
    tls::server_config(&options).expect("server config from reused files");
}

#[test]
fn half_a_stored_identity_is_an_error_not_a_silent_replacement() {
    let dir = tempfile::tempdir().expect("temp dir");
    tls::load_or_create_self_signed(dir.path()).expect("generate");
    std::fs::remove_file(dir.path().join(tls::SELF_SIGNED_CERT_FILE)).expect("remove cert");
    let err = tls::load_or_create_self_signed(dir.path()).expect_err("half identity");
    assert!(matches!(err, tls::TlsError::HalfIdentity { .. }), "{err}");
}

#[test]
fn configured_certificate_and_key_files_load_and_garbage_is_rejected() {
    let dir = tempfile::tempdir().expect("temp dir");
    let generated =
        rcgen::generate_simple_self_signed(vec!["broker.example".to_string()]).expect("generate");
    let cert_path = dir.path().join("server.pem");
    let key_path = dir.path().join("server.key");
    std::fs::write(&cert_path, generated.cert.pem()).expect("write cert");
    std::fs::write(&key_path, generated.signing_key.serialize_pem()).expect("write key");
    let options = ServerTlsOptions {
        identity: ServerIdentity::Files {
            cert_path: cert_path.clone(),
            key_path: key_path.clone(),
        },
        client_ca_path: None,
        client_cert_accounts: Default::default(),
    };
    let identity = tls::server_identity(&options).expect("load configured files");
    assert_eq!(identity.leaf().as_ref(), generated.cert.der().as_ref());
    tls::server_config(&options).expect("server config");

    std::fs::write(&cert_path, "not a certificate\n").expect("overwrite cert");
    let err = tls::server_config(&options).expect_err("no certificate in file");
    assert!(matches!(err, tls::TlsError::NoCertificate { .. }), "{err}");

    let missing = ServerTlsOptions {
        identity: ServerIdentity::Files {
            cert_path: dir.path().join("absent.pem"),
            key_path,
        },
        client_ca_path: None,
        client_cert_accounts: Default::default(),
    };
    assert!(tls::server_config(&missing).is_err());
}

#[test]
fn configs_speak_tls13_with_the_sluice_alpn() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (identity, _) = tls::load_or_create_self_signed(dir.path()).expect("generate");
    let server = tls::rustls_server_config(&identity, None).expect("server");
    assert_eq!(server.alpn_protocols, vec![tls::ALPN.to_vec()]);
    let client = tls::rustls_client_config(&identity.cert_chain, None).expect("client");
    assert_eq!(client.alpn_protocols, vec![b"sluice/1".to_vec()]);
}
