// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title StakeToken
/// @notice The ERC20 that devnets and testnets stake and pay rewards in. A production pool may use any ERC20.
contract StakeToken is ERC20, ERC20Permit, Ownable {
    /// @param initialOwner The only account that may mint.
    constructor(address initialOwner) ERC20("Prime Stake", "PSTK") ERC20Permit("Prime Stake") Ownable(initialOwner) {}

    /// @notice Creates `amount` new tokens for `to`.
    /// @dev Requirements: caller is the owner. Emits {Transfer} from the zero address.
    /// @param to Receiver of the new tokens.
    /// @param amount Amount in the token's smallest unit (18 decimals).
    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
