//! The `static` discovery plugin (being built on tributary-plugin-sdk).
fn main() {
    eprintln!("tributary-plugin-static: not built yet");
    std::process::exit(1);
}
