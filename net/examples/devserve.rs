fn main() {
    let mut c = pico_net::ServerConfig::default();
    let args: Vec<String> = std::env::args().collect();
    c.listen = args[1].clone();
    c.admin_listen = Some(args[2].clone());
    if args.len() > 3 {
        c.cores = args[3].parse().unwrap();
    }
    if let Err(e) = pico_net::run(c) {
        eprintln!("pico: {e}");
        std::process::exit(1);
    }
}
