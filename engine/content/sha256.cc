// SHA-256 through OpenSSL's EVP interface (SHA-NI where the CPU has it).
#include <openssl/evp.h>

#include <stdexcept>

#include "gpumigrate/content/content_store.h"

namespace gpumigrate {

Sha256Hasher::Sha256Hasher() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

ContentDigest Sha256Hasher::Digest(std::span<const std::byte> bytes) {
  auto* ctx = static_cast<EVP_MD_CTX*>(ctx_);
  ContentDigest d{};
  unsigned len = 0;
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1 || EVP_DigestUpdate(ctx, bytes.data(), bytes.size()) != 1 ||
      EVP_DigestFinal_ex(ctx, d.data(), &len) != 1 || len != d.size()) {
    throw std::runtime_error("OpenSSL SHA-256 failed");
  }
  return d;
}

ContentDigest Sha256(std::span<const std::byte> bytes) {
  thread_local Sha256Hasher h;
  return h.Digest(bytes);
}

std::string DigestHex(const ContentDigest& d) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : d) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

}  // namespace gpumigrate
