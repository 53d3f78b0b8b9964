//! The sans-IO RUDP connection and endpoint: handshake, ARQ, congestion control, channels.
