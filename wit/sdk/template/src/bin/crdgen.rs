//! Prints the CRD generated from the spec type: `cargo run --features crd --bin crdgen > crd.yaml`.

fn main() {
    match plugin_template::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("cannot render the CRD as YAML: {e}");
            std::process::exit(1);
        }
    }
}
