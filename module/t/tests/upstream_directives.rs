//! Table of cases for add_upstream, combine_server_singlets and extend_single_peers.

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let tests = vec![libtest_mimic::Trial::test("module_so_exists", || {
        let p = ngx_harness::module_path();
        if p.is_file() {
            Ok(())
        } else {
            Err(format!(
                "module not found at {}: run `cargo build --release -p ngx-combined-upstreams`",
                p.display()
            )
            .into())
        }
    })];
    libtest_mimic::run(&args, tests).exit();
}
