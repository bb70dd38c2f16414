#include "transport/crypto/frame_protector.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <cstring>

#include <fmt/format.h>

namespace gpumigrate {
namespace {

class IntegrityOnly final : public FrameProtector {
 public:
  explicit IntegrityOnly(uint64_t key) : key_(key) {}
  Result<std::span<const std::byte>> Seal(std::span<const std::byte> header, uint32_t, uint64_t,
                                          std::span<const std::byte> payload, std::vector<std::byte>&,
                                          wire::Tag& tag) override {
    tag = wire::ComputeTag(key_, header, payload);
    return payload;
  }
  Status SealInPlace(std::span<const std::byte> header, uint32_t, uint64_t, std::span<std::byte> payload,
                     wire::Tag& tag) override {
    tag = wire::ComputeTag(key_, header, payload);
    return Status::Ok();
  }
  Status Open(std::span<const std::byte> header, uint32_t, uint64_t, std::span<std::byte> payload,
              const wire::Tag& tag) override {
    if (wire::ComputeTag(key_, header, payload) != tag) {
      return Corrupt("tag mismatch: the frame is corrupt or belongs to another session");
    }
    return Status::Ok();
  }

 private:
  uint64_t key_;
};

class AesGcm final : public FrameProtector {
 public:
  explicit AesGcm(const std::array<std::byte, 32>& key) : key_(key), enc_(EVP_CIPHER_CTX_new()), dec_(EVP_CIPHER_CTX_new()) {
    EVP_EncryptInit_ex(enc_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr);
    EVP_DecryptInit_ex(dec_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr);
  }
  ~AesGcm() override {
    EVP_CIPHER_CTX_free(enc_);
    EVP_CIPHER_CTX_free(dec_);
  }

  Result<std::span<const std::byte>> Seal(std::span<const std::byte> header, uint32_t stream, uint64_t sequence,
                                          std::span<const std::byte> payload, std::vector<std::byte>& scratch,
                                          wire::Tag& tag) override {
    scratch.assign(payload.begin(), payload.end());
    GM_RETURN_IF_ERROR(SealInPlace(header, stream, sequence, scratch, tag));
    return std::span<const std::byte>(scratch);
  }

  Status SealInPlace(std::span<const std::byte> header, uint32_t stream, uint64_t sequence,
                     std::span<std::byte> payload, wire::Tag& tag) override {
    auto nonce = Nonce(stream, sequence);
    int len = 0;
    if (EVP_EncryptInit_ex(enc_, nullptr, nullptr, U(key_.data()), U(nonce.data())) != 1 ||
        EVP_EncryptUpdate(enc_, nullptr, &len, U(header.data()), static_cast<int>(header.size())) != 1 ||
        (!payload.empty() && EVP_EncryptUpdate(enc_, U(payload.data()), &len, U(payload.data()),
                                               static_cast<int>(payload.size())) != 1) ||
        EVP_EncryptFinal_ex(enc_, U(payload.data()) + payload.size(), &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(enc_, EVP_CTRL_GCM_GET_TAG, 16, tag.data()) != 1) {
      return Internal("aes-gcm: seal failed");
    }
    return Status::Ok();
  }

  Status Open(std::span<const std::byte> header, uint32_t stream, uint64_t sequence, std::span<std::byte> payload,
              const wire::Tag& tag) override {
    auto nonce = Nonce(stream, sequence);
    int len = 0;
    wire::Tag t = tag;
    if (EVP_DecryptInit_ex(dec_, nullptr, nullptr, U(key_.data()), U(nonce.data())) != 1 ||
        EVP_DecryptUpdate(dec_, nullptr, &len, U(header.data()), static_cast<int>(header.size())) != 1 ||
        (!payload.empty() && EVP_DecryptUpdate(dec_, U(payload.data()), &len, U(payload.data()),
                                               static_cast<int>(payload.size())) != 1) ||
        EVP_CIPHER_CTX_ctrl(dec_, EVP_CTRL_GCM_SET_TAG, 16, t.data()) != 1) {
      return Internal("aes-gcm: open failed");
    }
    if (EVP_DecryptFinal_ex(dec_, U(payload.data()) + payload.size(), &len) != 1) {
      return Corrupt("authentication failed: the frame is corrupt, forged or belongs to another session");
    }
    return Status::Ok();
  }

 private:
  static unsigned char* U(std::byte* p) { return reinterpret_cast<unsigned char*>(p); }
  static const unsigned char* U(const std::byte* p) { return reinterpret_cast<const unsigned char*>(p); }
  static std::array<std::byte, 12> Nonce(uint32_t stream, uint64_t sequence) {
    std::array<std::byte, 12> n;
    std::memcpy(n.data(), &stream, 4);
    std::memcpy(n.data() + 4, &sequence, 8);
    return n;
  }
  std::array<std::byte, 32> key_;
  EVP_CIPHER_CTX* enc_;
  EVP_CIPHER_CTX* dec_;
};

}  // namespace

std::unique_ptr<FrameProtector> MakeFrameProtector(const FrameKeys& keys) {
  if (keys.aes_gcm) return std::make_unique<AesGcm>(keys.aes_key);
  return std::make_unique<IntegrityOnly>(keys.integrity_key);
}

Result<std::array<std::byte, 32>> DeriveKey(std::span<const std::byte> secret, uint64_t session_id,
                                            std::string_view info) {
  std::array<std::byte, 32> out{};
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t len = out.size();
  bool ok = ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
            EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(&session_id), 8) == 1 &&
            EVP_PKEY_CTX_set1_hkdf_key(ctx, reinterpret_cast<const unsigned char*>(secret.data()),
                                       static_cast<int>(secret.size())) == 1 &&
            EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                        static_cast<int>(info.size())) == 1 &&
            EVP_PKEY_derive(ctx, reinterpret_cast<unsigned char*>(out.data()), &len) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok || len != out.size()) return Internal("crypto: HKDF-SHA256 failed");
  return out;
}

}  // namespace gpumigrate
