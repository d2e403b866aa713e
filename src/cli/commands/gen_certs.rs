//! `statusguard gen-certs`: a development CA and a serving certificate
//! signed by it, for `serve --tls-cert/--tls-key`.

use std::process::ExitCode;

use anyhow::Context as _;

use super::print_out;
use crate::cli::args::GenCertsArgs;
use crate::cluster::certs::policy::generate_certificates;

pub(crate) fn run(args: &GenCertsArgs) -> anyhow::Result<ExitCode> {
    let certs = generate_certificates(&args.tls_sans)?;
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    for (name, pem) in [
        ("ca.crt", &certs.ca_pem),
        ("tls.crt", &certs.cert_pem),
        ("tls.key", &certs.key_pem),
    ] {
        let path = args.out_dir.join(name);
        std::fs::write(&path, pem).with_context(|| format!("cannot write {}", path.display()))?;
    }
    print_out(&format!(
        "wrote ca.crt, tls.crt and tls.key to {}\n",
        args.out_dir.display()
    ));
    Ok(ExitCode::SUCCESS)
}
