//! PicoMQ load generator; `pico bench` lands here with the HTTP/2 work.
