package gateway
